package dev.pagewise.spark.bench;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.pagewise.hugepage.HugepageBuffers;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.Random;
import java.util.function.IntFunction;
import org.junit.jupiter.api.Test;

/** The parts of the experiment's workloads that every configuration must compute alike. */
class StorageBenchTest {
  static byte[] data(int n) {
    byte[] b = new byte[n];
    new Random(7).nextBytes(b);
    return b;
  }

  static ByteBuffer[] split(byte[] bytes, int chunk, IntFunction<ByteBuffer> alloc) {
    List<ByteBuffer> out = new ArrayList<>();
    for (int off = 0; off < bytes.length; off += chunk) {
      int len = Math.min(chunk, bytes.length - off);
      ByteBuffer b = alloc.apply(len);
      b.put(bytes, off, len).flip();
      out.add(b);
    }
    return out.toArray(new ByteBuffer[0]);
  }

  /**
   * The random pass reads by logical offset: the same bytes give the same chain whether they are
   * one buffer or chunks of 2 or 4 MiB, on the Java heap, in malloc'd direct memory or in the
   * hp_alloc arena (what off, part-old and part hold).
   */
  @Test
  void randomWalkDependsOnTheBytesOnly() {
    assertTrue(HugepageBuffers.available(), HugepageBuffers.unavailableReason());
    byte[] bytes = data((9 << 20) + 44);
    long expected = StorageBench.CachedBlocks.walk(split(bytes, bytes.length, ByteBuffer::allocate), 64, 5);
    assertEquals(expected, StorageBench.CachedBlocks.walk(split(bytes, 4 << 20, ByteBuffer::allocate), 64, 5));
    assertEquals(expected, StorageBench.CachedBlocks.walk(split(bytes, 2 << 20, ByteBuffer::allocateDirect), 64, 5));
    ByteBuffer[] huge = split(bytes, 4 << 20, HugepageBuffers::allocate);
    assertEquals(expected, StorageBench.CachedBlocks.walk(huge, 64, 5));
    for (ByteBuffer b : huge) {
      HugepageBuffers.free(b);
    }
    // It reads the data: a walk that reads every word (on average 8 times) changes when one
    // word does; another seed gives another chain.
    byte[] small = data(1 << 20);
    long before = StorageBench.CachedBlocks.walk(split(small, 1 << 18, ByteBuffer::allocate), 1, 5);
    small[12345] ^= 1;
    assertNotEquals(before, StorageBench.CachedBlocks.walk(split(small, 1 << 18, ByteBuffer::allocate), 1, 5));
    assertNotEquals(expected, StorageBench.CachedBlocks.walk(split(bytes, 4 << 20, ByteBuffer::allocate), 64, 6));
  }

  @Test
  void randomWalkRejectsUnequalChunks() {
    ByteBuffer[] chunks = {ByteBuffer.allocate(1 << 20), ByteBuffer.allocate(2 << 20), ByteBuffer.allocate(8)};
    assertThrows(IllegalStateException.class, () -> StorageBench.CachedBlocks.walk(chunks, 64, 1));
  }

  @Test
  void generatedPartitionsCoverEveryRecordOnce() {
    long n = 1003;
    int parts = 8;
    long total = 0;
    for (int p = 0; p < parts; p++) {
      long[] next = {p};
      Iterator<Long> it = StorageBench.generate(p, n, parts, () -> {
        long v = next[0];
        next[0] += parts;
        return v;
      });
      while (it.hasNext()) {
        long v = it.next();
        assertEquals(p, v % parts);
        assertTrue(v < n);
        total++;
      }
      assertFalse(it.hasNext());
    }
    assertEquals(n, total);
  }

  /** The k-means points' noise: mean 0, variance 1, bounded, and the same sequence every run. */
  @Test
  void generatedNoiseHasUnitVarianceAndRepeats() {
    long[] state = {StorageBench.CachedBlocks.mix(1)};
    int n = 1_000_000;
    double sum = 0;
    double sq = 0;
    for (int i = 0; i < n; i++) {
      double g = StorageBench.nearGaussian(StorageBench.nextRandom(state));
      assertTrue(Math.abs(g) <= 2 * Math.sqrt(3) + 1e-9, "out of range: " + g);
      sum += g;
      sq += g * g;
    }
    double mean = sum / n;
    assertEquals(0, mean, 0.01);
    assertEquals(1, sq / n - mean * mean, 0.01);
    long[] a = {42};
    long[] b = {42};
    for (int i = 0; i < 10; i++) {
      assertEquals(StorageBench.nextRandom(a), StorageBench.nextRandom(b));
    }
    assertNotEquals(StorageBench.nextRandom(a), StorageBench.nextRandom(a));
    assertEquals(0.0, StorageBench.nearGaussian(0x7fff_8000_7fff_8000L), 1e-3);
  }

  @Test
  void resultLinesAreJson() {
    assertEquals("{\"a\":\"x\\\"y\",\"b\":1.5,\"c\":null,\"d\":7}", StorageBench.obj("a", "x\"y", "b", 1.5, "c",
        Double.NaN, "d", 7L));
  }
}
