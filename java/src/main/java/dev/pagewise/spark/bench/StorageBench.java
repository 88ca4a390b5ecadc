package dev.pagewise.spark.bench;

import dev.pagewise.spark.HugepageStorage;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import org.apache.spark.SparkConf;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.mllib.clustering.KMeans;
import org.apache.spark.mllib.clustering.KMeansModel;
import org.apache.spark.mllib.linalg.Vector;
import org.apache.spark.mllib.linalg.Vectors;
import org.apache.spark.storage.RDDInfo;
import org.apache.spark.storage.StorageLevel;

/**
 * The workloads of {@code pagewise eval spark-hugepages} (the paper's evaluation):
 *
 * <ul>
 *   <li>{@code micro BYTES PASSES,PARTITIONS}: cache BYTES of 1 KiB records in Storage Memory
 *       (MEMORY_ONLY_SER), then read all of it PASSES times (the paper's microbenchmark);
 *   <li>{@code kmeans BYTES ITERATIONS,PARTITIONS}: MLlib k-means (k = 8, PASSES iterations) over
 *       BYTES of cached 16-dimensional points (MEMORY_ONLY_SER).
 * </ul>
 *
 * <p>Prints one line {@code PAGEWISE-RESULT {json}} with the phase times (s), the cached bytes
 * (Spark's own storage info) and a checksum, so configurations can be checked to agree.
 */
public final class StorageBench {
  private StorageBench() {}

  public static void main(String[] args) {
    if (args.length != 3) {
      System.err.println("usage: StorageBench micro|kmeans BYTES PASSES[,PARTITIONS]");
      System.exit(2);
    }
    String kind = args[0];
    long bytes = Long.parseLong(args[1]);
    int passes = Integer.parseInt(args[2].split(",")[0]);
    int parts = args[2].contains(",") ? Integer.parseInt(args[2].split(",")[1]) : 8;
    JavaSparkContext sc = new JavaSparkContext(new SparkConf().setAppName("pagewise-spark-hugepages-" + kind));
    sc.setLogLevel("WARN");
    long t0 = System.nanoTime();
    double cacheS;
    List<Double> passS = new ArrayList<>();
    String checksum;
    long cached;
    if (kind.equals("micro")) {
      long records = bytes / 1024;
      JavaRDD<long[]> data = sc.parallelize(range(parts), parts).flatMap(p -> {
        List<long[]> out = new ArrayList<>();
        Random r = new Random(p);
        for (long i = p; i < records; i += parts) {
          long[] rec = new long[128];
          for (int j = 0; j < rec.length; j++) {
            rec[j] = r.nextLong();
          }
          out.add(rec);
        }
        return out.iterator();
      }).persist(StorageLevel.MEMORY_ONLY_SER());
      long n = data.count();
      cacheS = (System.nanoTime() - t0) / 1e9;
      long sum = 0;
      for (int i = 0; i < passes; i++) {
        long t = System.nanoTime();
        final int salt = i;
        sum = data.map(rec -> {
          long s = salt;
          for (long v : rec) {
            s += v;
          }
          return s;
        }).reduce(Long::sum);
        passS.add((System.nanoTime() - t) / 1e9);
      }
      checksum = n + ":" + sum;
      cached = cachedBytes(sc);
      data.unpersist(true);
    } else if (kind.equals("kmeans")) {
      long points = bytes / (16 * 8 + 16);
      JavaRDD<Vector> data = sc.parallelize(range(parts), parts).flatMap(p -> {
        List<Vector> out = new ArrayList<>();
        Random r = new Random(p);
        for (long i = p; i < points; i += parts) {
          double[] x = new double[16];
          int c = (int) (i % 8);
          for (int j = 0; j < x.length; j++) {
            x[j] = c * 10.0 + r.nextGaussian();
          }
          out.add(Vectors.dense(x));
        }
        return out.iterator();
      }).persist(StorageLevel.MEMORY_ONLY_SER());
      long n = data.count();
      cacheS = (System.nanoTime() - t0) / 1e9;
      long t = System.nanoTime();
      KMeansModel model = new KMeans().setK(8).setMaxIterations(passes).setInitializationMode("random")
          .setSeed(42).setEpsilon(0).run(data.rdd());
      passS.add((System.nanoTime() - t) / 1e9);
      checksum = n + ":" + Math.round(model.computeCost(data.rdd()));
      cached = cachedBytes(sc);
      data.unpersist(true);
    } else {
      throw new IllegalArgumentException("unknown workload " + kind + " (micro, kmeans)");
    }
    double total = (System.nanoTime() - t0) / 1e9;
    StringBuilder p = new StringBuilder();
    for (double d : passS) {
      p.append(p.length() == 0 ? "" : ",").append(String.format("%.4f", d));
    }
    System.out.println("PAGEWISE-RESULT {\"cache_s\":" + String.format("%.4f", cacheS) + ",\"pass_s\":[" + p
        + "],\"total_s\":" + String.format("%.4f", total) + ",\"cached_bytes\":" + cached + ",\"checksum\":\""
        + checksum + "\",\"driver_chunks\":" + HugepageStorage.chunksPlaced() + "}");
    sc.stop();
  }

  private static List<Integer> range(int n) {
    List<Integer> out = new ArrayList<>();
    for (int i = 0; i < n; i++) {
      out.add(i);
    }
    return out;
  }

  private static long cachedBytes(JavaSparkContext sc) {
    long total = 0;
    for (RDDInfo info : sc.sc().getRDDStorageInfo()) {
      total += info.memSize();
    }
    return total;
  }
}
