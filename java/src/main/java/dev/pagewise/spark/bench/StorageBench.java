package dev.pagewise.spark.bench;

import dev.pagewise.spark.HugepageStorage;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkEnv;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.mllib.clustering.KMeans;
import org.apache.spark.mllib.clustering.KMeansModel;
import org.apache.spark.mllib.linalg.Vector;
import org.apache.spark.mllib.linalg.Vectors;
import org.apache.spark.storage.RDDBlockId;
import org.apache.spark.storage.RDDInfo;
import org.apache.spark.storage.StorageLevel;
import org.apache.spark.util.io.ChunkedByteBuffer;
import scala.Option;

/**
 * The workloads of {@code pagewise eval spark-hugepages} (the paper's evaluation), run in one
 * application so that the JVMs start once per configuration:
 *
 * <pre>
 * StorageBench sizes=B1,B2 workloads=micro,kmeans random=R scan=S iters=I parts=P executors=E
 * </pre>
 *
 * <p>For every size in turn, and every workload at that size:
 *
 * <ul>
 *   <li>{@code micro}: cache B bytes of 8 KiB records in Storage Memory (MEMORY_ONLY_SER), then
 *       access them repeatedly (the paper's microbenchmark): R <em>random</em> passes — every
 *       task walks a dependent chain of 8-byte reads at random offsets of its cached block, read
 *       in place from the block's chunks, one read per 256 bytes cached (where TLB reach matters)
 *       — and S <em>scan</em> passes, which deserialize every record and sum it (sequential,
 *       CPU-bound in Kryo). Then unpersist.
 *   <li>{@code kmeans}: cache B bytes of {@value #DIMS}-dimensional points around 8 centres
 *       (MEMORY_ONLY_SER) and run MLlib k-means (k = 8, I iterations from fixed initial centres)
 *       over the cached RDD: every iteration reads the cached blocks. Then unpersist.
 * </ul>
 *
 * <p>It waits for E executors before it starts. It prints one {@code PAGEWISE-PHASE {json}} line
 * per phase (cache, each pass, k-means, unpersist) with wall-clock start and end (epoch ms, so
 * the caller can align its own samples) and one {@code PAGEWISE-RESULT {json}} per workload and
 * size with the cached bytes (Spark's storage info), how many partitions were cached, how many
 * executors ran, and a checksum so configurations can be checked to agree. It exits non-zero if
 * a dataset is not entirely cached.
 */
public final class StorageBench {
  private StorageBench() {}

  /**
   * Longs per micro record (8 KiB). Kryo's cost per record (class, reference map reset) is paid
   * once per record whatever its size, so larger records cache faster per byte; caching is
   * serialization work that hugepages barely change.
   */
  static final int RECORD_LONGS = 1024;

  /** Dimensions of a k-means point (few points per byte, for the same reason). */
  static final int DIMS = 64;

  /** One read per this many cached bytes in a random pass. */
  static final long BYTES_PER_READ = 256;

  public static void main(String[] args) {
    Map<String, String> a = parse(args);
    List<Long> sizes = new ArrayList<>();
    for (String s : a.getOrDefault("sizes", "").split(",")) {
      if (!s.isEmpty()) {
        sizes.add(Long.parseLong(s));
      }
    }
    List<String> workloads = Arrays.asList(a.getOrDefault("workloads", "micro,kmeans").split(","));
    int random = Integer.parseInt(a.getOrDefault("random", "3"));
    int scan = Integer.parseInt(a.getOrDefault("scan", "1"));
    int iters = Integer.parseInt(a.getOrDefault("iters", "5"));
    int parts = Integer.parseInt(a.getOrDefault("parts", "8"));
    int executors = Integer.parseInt(a.getOrDefault("executors", "0"));
    for (String w : workloads) {
      if (!w.equals("micro") && !w.equals("kmeans")) {
        usage("unknown workload " + w + " (micro, kmeans)");
      }
    }
    if (sizes.isEmpty() || random < 0 || scan < 0 || iters < 1 || parts < 1) {
      usage("bad arguments " + a);
    }
    JavaSparkContext sc = new JavaSparkContext(new SparkConf().setAppName("pagewise-spark-hugepages"));
    sc.setLogLevel("WARN");
    int failures = 0;
    try {
      int seen = waitForExecutors(sc, executors);
      emit("PAGEWISE-START", obj("executors", seen, "t_ms", System.currentTimeMillis()));
      for (long bytes : sizes) {
        for (String w : workloads) {
          failures += w.equals("micro") ? micro(sc, bytes, random, scan, parts) : kmeans(sc, bytes, iters, parts);
        }
      }
    } finally {
      sc.stop();
    }
    System.exit(failures == 0 ? 0 : 1);
  }

  private static void usage(String why) {
    System.err.println("StorageBench: " + why + "\nusage: StorageBench sizes=BYTES[,BYTES..] "
        + "[workloads=micro,kmeans] [random=3] [scan=1] [iters=5] [parts=8] [executors=N]");
    System.exit(2);
  }

  private static Map<String, String> parse(String[] args) {
    Map<String, String> out = new LinkedHashMap<>();
    for (String arg : args) {
      int eq = arg.indexOf('=');
      if (eq <= 0) {
        usage("argument " + arg + " is not KEY=VALUE");
      }
      out.put(arg.substring(0, eq), arg.substring(eq + 1));
    }
    return out;
  }

  /** Wait until {@code n} executors are registered (2 minutes at most); returns how many are. */
  static int waitForExecutors(JavaSparkContext sc, int n) {
    long deadline = System.nanoTime() + 120_000_000_000L;
    while (true) {
      // The driver is listed too (in local mode it is the only executor).
      int seen = Math.max(1, sc.sc().statusTracker().getExecutorInfos().length - 1);
      if (sc.isLocal() || seen >= n || System.nanoTime() > deadline) {
        return seen;
      }
      try {
        Thread.sleep(200);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        return seen;
      }
    }
  }

  private static int micro(JavaSparkContext sc, long bytes, int random, int scan, int parts) {
    long records = bytes / (RECORD_LONGS * 8);
    long t0 = System.currentTimeMillis();
    // Records are made as Spark unrolls them into the cache, never held as a list.
    JavaRDD<long[]> data = sc.parallelize(range(parts), parts).flatMap(p -> {
      long[] state = {CachedBlocks.mix(p + 1)};
      return generate(p, records, parts, () -> {
        long[] rec = new long[RECORD_LONGS];
        for (int j = 0; j < rec.length; j++) {
          rec[j] = nextRandom(state);
        }
        return rec;
      });
    }).persist(StorageLevel.MEMORY_ONLY_SER());
    long n = data.count();
    phase("micro", bytes, "cache", 0, t0);
    int rddId = data.id();
    long walk = 0;
    long nonLocal = 0;
    for (int i = 0; i < random; i++) {
      long t = System.currentTimeMillis();
      final long salt = i;
      long[] r = data.mapPartitionsWithIndex((idx, it) -> {
        // Having asked for the iterator, this task holds a read lock on its cached block (when
        // local): the block's chunks stay in place while they are read below.
        long[] v = CachedBlocks.randomWalk(rddId, idx, BYTES_PER_READ, salt);
        return List.of(v).iterator();
      }, true).reduce((x, y) -> new long[] {x[0] + y[0], x[1] + y[1]});
      walk += r[0];
      nonLocal += r[1];
      phase("micro", bytes, "random", i, t);
    }
    long sum = 0;
    for (int i = 0; i < scan; i++) {
      long t = System.currentTimeMillis();
      final int salt = i;
      sum += data.map(rec -> {
        long s = salt;
        for (long v : rec) {
          s += v;
        }
        return s;
      }).reduce(Long::sum);
      phase("micro", bytes, "scan", i, t);
    }
    return finish(sc, data, "micro", bytes, n + ":" + walk + ":" + sum, Double.NaN, nonLocal, t0);
  }

  private static int kmeans(JavaSparkContext sc, long bytes, int iters, int parts) {
    long points = bytes / (DIMS * 8 + 16);
    long t0 = System.currentTimeMillis();
    JavaRDD<Vector> data = sc.parallelize(range(parts), parts).flatMap(p -> {
      long[] state = {CachedBlocks.mix(p + 1)};
      long[] i = {p};
      return generate(p, points, parts, () -> {
        double[] x = new double[DIMS];
        int c = (int) (i[0] % 8);
        i[0] += parts;
        for (int j = 0; j < x.length; j++) {
          x[j] = c * 10.0 + nearGaussian(nextRandom(state));
        }
        return Vectors.dense(x);
      });
    }).persist(StorageLevel.MEMORY_ONLY_SER());
    long n = data.count();
    phase("kmeans", bytes, "cache", 0, t0);
    long t = System.currentTimeMillis();
    // data is cached, so MLlib reads it from Storage Memory in every iteration (it caches only
    // the norms itself). Fixed initial centres, 3 off each cluster's true centre: no sampling
    // passes over the data before the iterations, and the same start in every configuration.
    Vector[] init = new Vector[8];
    for (int c = 0; c < 8; c++) {
      double[] x = new double[DIMS];
      Arrays.fill(x, c * 10.0 + 3.0);
      init[c] = Vectors.dense(x);
    }
    KMeansModel model = new KMeans().setK(8).setMaxIterations(iters).setInitialModel(new KMeansModel(init))
        .setEpsilon(0).run(data.rdd());
    phase("kmeans", bytes, "kmeans", 0, t);
    // The cost of the last iteration, summed over partitions in arrival order: it can differ
    // in its last bits between runs, so the caller compares it with a relative tolerance.
    double cost = model.trainingCost();
    return finish(sc, data, "kmeans", bytes, String.valueOf(n), cost, 0, t0);
  }

  private static int finish(JavaSparkContext sc, JavaRDD<?> data, String workload, long bytes, String checksum,
      double cost, long nonLocal, long t0) {
    long cached = 0;
    int cachedParts = 0;
    int parts = data.getNumPartitions();
    for (RDDInfo info : sc.sc().getRDDStorageInfo()) {
      if (info.id() == data.id()) {
        cached += info.memSize();
        cachedParts += info.numCachedPartitions();
      }
    }
    long t = System.currentTimeMillis();
    data.unpersist(true);
    phase(workload, bytes, "unpersist", 0, t);
    emit("PAGEWISE-RESULT", obj("workload", workload, "bytes", bytes, "cached_bytes", cached, "cached_partitions",
        cachedParts, "partitions", parts, "non_local_blocks", nonLocal, "checksum", checksum, "cost", cost,
        "start_ms", t0, "end_ms", System.currentTimeMillis(), "driver_chunks", HugepageStorage.chunksPlaced()));
    int bad = 0;
    if (cachedParts != parts) {
      System.err.println("StorageBench: " + workload + " " + bytes + ": only " + cachedParts + " of " + parts
          + " partitions cached (storage memory too small?)");
      bad++;
    }
    if (nonLocal != 0) {
      System.err.println("StorageBench: " + workload + " " + bytes + ": " + nonLocal
          + " random-pass tasks ran where their block was not cached (walked a fetched copy)");
    }
    return bad;
  }

  private static void phase(String workload, long bytes, String phase, int pass, long startMs) {
    long end = System.currentTimeMillis();
    emit("PAGEWISE-PHASE", obj("workload", workload, "bytes", bytes, "phase", phase, "pass", pass, "start_ms",
        startMs, "end_ms", end, "s", (end - startMs) / 1e3));
  }

  private static void emit(String tag, String json) {
    System.out.println(tag + " " + json);
    System.out.flush();
  }

  /** A flat JSON object from key, value pairs (numbers, strings; NaN as null). */
  static String obj(Object... kv) {
    StringBuilder b = new StringBuilder("{");
    for (int i = 0; i < kv.length; i += 2) {
      b.append(i == 0 ? "" : ",").append('"').append(kv[i]).append("\":");
      Object v = kv[i + 1];
      if (v instanceof String) {
        b.append('"').append(((String) v).replace("\\", "\\\\").replace("\"", "\\\"")).append('"');
      } else if (v instanceof Double) {
        double d = (Double) v;
        b.append(Double.isFinite(d) ? Double.toString(d) : "null");
      } else {
        b.append(v);
      }
    }
    return b.append('}').toString();
  }

  /** Records p, p + parts, ... below n of partition p, each made by {@code make} when asked for. */
  static <T> java.util.Iterator<T> generate(long p, long n, int parts, java.util.function.Supplier<T> make) {
    return new java.util.Iterator<T>() {
      long i = p;

      @Override
      public boolean hasNext() {
        return i < n;
      }

      @Override
      public T next() {
        if (i >= n) {
          throw new java.util.NoSuchElementException();
        }
        i += parts;
        return make.get();
      }
    };
  }

  /**
   * The next value of a splitmix64 sequence whose state is {@code state[0]}: a few
   * multiplications per value (java.util.Random's nextLong and nextGaussian cost a CAS and,
   * for the Gaussian, a logarithm and a square root, and made data generation a large part of
   * caching). The same sequence in every configuration.
   */
  static long nextRandom(long[] state) {
    state[0] += 0x9e3779b97f4a7c15L;
    return CachedBlocks.mix(state[0]);
  }

  /**
   * A value of mean 0 and variance 1, close to Gaussian, from 64 random bits: the sum of four
   * 16-bit uniforms (Irwin-Hall), centred and scaled; within [-2 sqrt(3), 2 sqrt(3)].
   */
  static double nearGaussian(long bits) {
    long sum = (bits & 0xffff) + ((bits >>> 16) & 0xffff) + ((bits >>> 32) & 0xffff) + (bits >>> 48);
    // Each 16-bit uniform has mean 32767.5 and variance (65536^2 - 1) / 12.
    return (sum - 4 * 32767.5) * (Math.sqrt(3.0) / 65536.0);
  }

  private static List<Integer> range(int n) {
    List<Integer> out = new ArrayList<>();
    for (int i = 0; i < n; i++) {
      out.add(i);
    }
    return out;
  }

  /** Reading a cached block's serialized bytes in place. */
  public static final class CachedBlocks {
    private CachedBlocks() {}

    /**
     * A dependent chain of 8-byte reads at random offsets of partition {@code partition} of RDD
     * {@code rddId}, read in place from the block's chunks in this executor's memory store
     * (wherever they live: Java heap, malloc, or the hp_alloc arena), one read per
     * {@code bytesPerRead} bytes; the next offset depends on the value read, so every read waits
     * for the previous one (and its address translation). Returns {the chain's last value, 0},
     * or, when the task runs where the block is not cached, {the same walk over a fetched copy,
     * 1}: the result is the same, the time is not the cached block's.
     */
    public static long[] randomWalk(int rddId, int partition, long bytesPerRead, long salt) {
      RDDBlockId id = new RDDBlockId(rddId, partition);
      long seed = salt ^ ((long) partition << 32);
      Option<ChunkedByteBuffer> bytes = SparkEnv.get().blockManager().memoryStore().getBytes(id);
      if (bytes.isDefined()) {
        return new long[] {walk(bytes.get().getChunks(), bytesPerRead, seed), 0};
      }
      Option<ChunkedByteBuffer> remote = SparkEnv.get().blockManager().getRemoteBytes(id);
      if (remote.isEmpty()) {
        throw new IllegalStateException(id + " is cached nowhere");
      }
      return new long[] {walk(remote.get().getChunks(), bytesPerRead, seed), 1};
    }

    /**
     * The walk over chunks of equal size (the last may be shorter), as Spark's
     * ChunkedByteBufferOutputStream writes them; offsets are logical, so the result depends on
     * the bytes only, not on how they are split or where they are.
     */
    public static long walk(ByteBuffer[] chunks, long bytesPerRead, long seed) {
      long total = 0;
      for (ByteBuffer c : chunks) {
        total += c.limit();
      }
      long words = total / 8;
      if (words == 0) {
        return mix(seed);
      }
      long chunk = chunks[0].limit();
      for (int i = 0; i + 1 < chunks.length; i++) {
        if (chunks[i].limit() != chunk || chunk % 8 != 0) {
          throw new IllegalStateException("cached block chunks of unequal sizes: " + chunks[i].limit() + " vs " + chunk);
        }
      }
      long reads = Math.max(1, total / bytesPerRead);
      long x = mix(seed);
      if (words < (1L << 32) && Long.bitCount(chunk) == 1) {
        // The common case (Spark's chunk size is a power of two, a block below 32 GiB): the
        // word is hi32(x) * words / 2^32 (a multiply, no division) and the chunk a shift, so
        // the chain waits on memory, not on the divider. The loop below picks the same words.
        int shift = Long.numberOfTrailingZeros(chunk);
        long mask = chunk - 1;
        for (long i = 0; i < reads; i++) {
          long off = (((x >>> 32) * words) >>> 32) << 3;
          long v = chunks[(int) (off >>> shift)].getLong((int) (off & mask));
          x = mix(x ^ v);
        }
        return x;
      }
      for (long i = 0; i < reads; i++) {
        long off = (((x >>> 32) * words) >>> 32) << 3;
        if (words >= (1L << 32)) {
          off = Long.remainderUnsigned(x, words) * 8;
        }
        int c = (int) (off / chunk);
        long v = chunks[c].getLong((int) (off - c * chunk));
        x = mix(x ^ v);
      }
      return x;
    }

    /** splitmix64's finalizer. */
    static long mix(long z) {
      z = (z ^ (z >>> 30)) * 0xbf58476d1ce4e5b9L;
      z = (z ^ (z >>> 27)) * 0x94d049bb133111ebL;
      return z ^ (z >>> 31);
    }
  }
}
