package dev.pagewise.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.pagewise.hugepage.HugepageBuffers;
import dev.pagewise.spark.bench.StorageBench;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.List;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkEnv;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.storage.BlockManager;
import org.apache.spark.storage.RDDBlockId;
import org.apache.spark.storage.StorageLevel;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import scala.collection.JavaConverters;
import scala.reflect.ClassTag;
import scala.reflect.ClassTag$;

/**
 * A real Spark (local mode) with the agent loaded through spark.plugins: serialized cached
 * blocks go to the arena, give the same results as uncached data, and are freed on unpersist.
 */
class SparkLocalModeTest {
  static JavaSparkContext sc;
  static final int N = 300_000;

  @BeforeAll
  static void start() {
    SparkConf conf = new SparkConf()
        .setMaster("local[2]")
        .setAppName("pagewise-agent-test")
        .set("spark.plugins", HugepagePlugin.class.getName())
        .set("spark.ui.enabled", "false")
        .set("spark.driver.host", "127.0.0.1")
        .set("spark.driver.bindAddress", "127.0.0.1")
        .set("spark.storage.unrollMemoryThreshold", String.valueOf(2 << 20))
        .set("spark.memory.offHeap.enabled", "true")
        .set("spark.memory.offHeap.size", String.valueOf(256 << 20));
    sc = new JavaSparkContext(conf);
    sc.setLogLevel("WARN");
  }

  @AfterAll
  static void stop() {
    if (sc != null) {
      sc.stop();
    }
  }

  static JavaRDD<Long> data(int n, int parts) {
    List<Integer> idx = new ArrayList<>();
    for (int i = 0; i < parts; i++) {
      idx.add(i);
    }
    return sc.parallelize(idx, parts).flatMap(p -> {
      List<Long> out = new ArrayList<>();
      for (long i = p; i < n; i += parts) {
        out.add((i * 2654435761L) % 1000003L);
      }
      return out.iterator();
    });
  }

  static long[] summary(JavaRDD<Long> rdd) {
    long count = rdd.count();
    long sum = rdd.reduce(Long::sum);
    long sq = rdd.map(x -> (x * x) % 998244353L).reduce((a, b) -> (a + b) % 998244353L);
    return new long[] {count, sum, sq};
  }

  @Test
  void cachedSerializedBlocksLiveOnHugepagesAndAreFreed() {
    assertTrue(HugepageAgent.active() || HugepageAgent.status().startsWith("pending"), HugepageAgent.status());
    long[] expected = summary(data(N, 4));
    for (StorageLevel level : new StorageLevel[] {StorageLevel.MEMORY_ONLY_SER(), StorageLevel.OFF_HEAP(),
        StorageLevel.MEMORY_AND_DISK_SER()}) {
      long live0 = HugepageBuffers.stats().liveAllocations();
      long chunks0 = HugepageStorage.chunksPlaced();
      JavaRDD<Long> cached = data(N, 4).persist(level);
      long[] first = summary(cached);
      long[] second = summary(cached);
      assertTrue(HugepageAgent.active(), HugepageAgent.status());
      assertEquals(expected[0], first[0], level.description());
      assertEquals(expected[1], first[1], level.description());
      assertEquals(expected[2], first[2], level.description());
      assertEquals(first[1], second[1]);
      assertTrue(HugepageStorage.chunksPlaced() > chunks0, "no chunk went to the arena for " + level.description());
      HugepageBuffers.Stats during = HugepageBuffers.stats();
      assertTrue(during.liveAllocations() >= live0 + 4, level.description() + ": " + during);
      cached.unpersist(true);
      assertEquals(live0, HugepageBuffers.stats().liveAllocations(), "blocks not freed on unpersist: "
          + level.description());
    }
  }

  /**
   * The experiment's random pass reads a cached block in place, in the arena, and computes what
   * the same bytes give anywhere else (a copy on the Java heap).
   */
  @Test
  void randomPassReadsCachedBlocksInPlace() {
    JavaRDD<Long> cached = data(N, 4).persist(StorageLevel.MEMORY_ONLY_SER());
    assertEquals(N, cached.count());
    int rdd = cached.id();
    List<long[]> walks = cached.mapPartitionsWithIndex(
        (idx, it) -> List.of(StorageBench.CachedBlocks.randomWalk(rdd, idx, 64, 3)).iterator(), true).collect();
    assertEquals(4, walks.size());
    for (int p = 0; p < 4; p++) {
      assertEquals(0, walks.get(p)[1], "partition " + p + " was not read where it is cached");
      ByteBuffer[] chunks = SparkEnv.get().blockManager().memoryStore().getBytes(new RDDBlockId(rdd, p)).get()
          .getChunks();
      ByteBuffer[] copy = new ByteBuffer[chunks.length];
      for (int i = 0; i < chunks.length; i++) {
        assertTrue(chunks[i].isDirect(), "a serialized block chunk is not an arena buffer");
        copy[i] = ByteBuffer.allocate(chunks[i].limit()).put(chunks[i].duplicate()).flip();
      }
      assertEquals(StorageBench.CachedBlocks.walk(copy, 64, 3 ^ ((long) p << 32)), walks.get(p)[0]);
    }
    cached.unpersist(true);
  }

  @Test
  void deserializedCachingIsLeftAlone() {
    long chunks0 = HugepageStorage.chunksPlaced();
    JavaRDD<Long> cached = data(100_000, 2).persist(StorageLevel.MEMORY_ONLY());
    assertEquals(100_000, cached.count());
    assertEquals(chunks0, HugepageStorage.chunksPlaced(), "MEMORY_ONLY objects stay on the Java heap");
    cached.unpersist(true);
  }

  /**
   * 1,000 cache/unpersist cycles through Spark's BlockManager (the MemoryStore path a cached
   * partition takes: putIteratorAsBytes, then removeBlock, which disposes the chunks), plus 10
   * through whole RDD jobs: the arena ends where it started.
   */
  @Test
  void thousandCacheUnpersistCyclesLeakNothing() {
    JavaRDD<Long> warm = data(30_000, 1).persist(StorageLevel.MEMORY_ONLY_SER());
    warm.count();
    warm.unpersist(true);
    long live0 = HugepageBuffers.stats().liveAllocations();
    long freed0 = HugepageBuffers.buffersFreed();
    BlockManager bm = SparkEnv.get().blockManager();
    ClassTag<Long> tag = ClassTag$.MODULE$.apply(Long.class);
    for (int i = 0; i < 1000; i++) {
      List<Long> values = new ArrayList<>();
      for (long v = 0; v < 5_000; v++) {
        values.add(v * i);
      }
      RDDBlockId id = new RDDBlockId(1_000_000 + i, 0);
      assertTrue(bm.putIterator(id, JavaConverters.asScalaIterator(values.iterator()), StorageLevel.MEMORY_ONLY_SER(),
          false, tag));
      bm.removeBlock(id, false);
    }
    for (int i = 0; i < 10; i++) {
      JavaRDD<Long> c = data(30_000, 1).persist(StorageLevel.MEMORY_ONLY_SER());
      assertEquals(30_000, c.count());
      c.unpersist(true);
    }
    HugepageBuffers.Stats s = HugepageBuffers.stats();
    assertEquals(live0, s.liveAllocations(), s.toString());
    assertTrue(HugepageBuffers.buffersFreed() - freed0 >= 1010, "freed " + (HugepageBuffers.buffersFreed() - freed0));
    // Reuse keeps the arena from growing: a few segments at most.
    assertTrue(s.mappedBytes() <= 512L << 20, s.toString());
  }
}
