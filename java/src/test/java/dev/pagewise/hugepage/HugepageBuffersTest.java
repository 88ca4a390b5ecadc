package dev.pagewise.hugepage;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import org.junit.jupiter.api.Test;

class HugepageBuffersTest {
  static String thpMode() throws Exception {
    String s = Files.readString(Path.of("/sys/kernel/mm/transparent_hugepage/enabled"));
    return s.substring(s.indexOf('[') + 1, s.indexOf(']'));
  }

  @Test
  void buffersHoldDataAndGoBackToTheArena() {
    assertTrue(HugepageBuffers.available(), HugepageBuffers.unavailableReason());
    HugepageBuffers.Stats before = HugepageBuffers.stats();
    ByteBuffer b = HugepageBuffers.allocate(5 << 20);
    assertTrue(b.isDirect());
    assertEquals(5 << 20, b.capacity());
    for (int i = 0; i < b.capacity(); i += 8) {
      b.putLong(i, i * 31L);
    }
    for (int i = 0; i < b.capacity(); i += 8) {
      assertEquals(i * 31L, b.getLong(i));
    }
    HugepageBuffers.Stats during = HugepageBuffers.stats();
    assertEquals(before.liveAllocations() + 1, during.liveAllocations());
    assertEquals(before.requestedBytes() + (5 << 20), during.requestedBytes());
    assertTrue(during.rssBytes() >= 5 << 20, during.toString());
    HugepageBuffers.free(b);
    HugepageBuffers.free(b); // a Cleaner runs once
    assertEquals(before.liveAllocations(), HugepageBuffers.stats().liveAllocations());
  }

  @Test
  void writtenBuffersAreOnHugepages() throws Exception {
    String mode = thpMode();
    if (!mode.equals("always") && !mode.equals("madvise")) {
      System.err.println("skipped: THP is " + mode + " on this machine");
      return;
    }
    ByteBuffer b = HugepageBuffers.allocate(16 << 20);
    for (int i = 0; i < b.capacity(); i += 4096) {
      b.put(i, (byte) 1);
    }
    HugepageBuffers.Stats s = HugepageBuffers.stats();
    assertTrue(s.hugepageBytes() >= 8 << 20, "hugepage bytes " + s);
    HugepageBuffers.free(b);
  }

  @Test
  void manySmallBuffersDoNotLeak() {
    long base = HugepageBuffers.stats().liveAllocations();
    for (int i = 0; i < 1000; i++) {
      ByteBuffer b = HugepageBuffers.allocate(1 + (i * 7919) % 300_000);
      b.put(0, (byte) i);
      HugepageBuffers.free(b);
    }
    assertEquals(base, HugepageBuffers.stats().liveAllocations());
  }

  @Test
  void badInputIsRefused() {
    assertThrows(IllegalArgumentException.class, () -> HugepageBuffers.allocate(-1));
    assertThrows(IllegalArgumentException.class, () -> HugepageBuffers.free(ByteBuffer.allocate(10)));
    ByteBuffer b = HugepageBuffers.allocate(100);
    assertThrows(IllegalArgumentException.class, () -> HugepageBuffers.free(b.slice()));
    HugepageBuffers.free(b);
  }

  /** ESTALE on Linux. */
  private static final int ESTALE = 116;

  /**
   * A late free of a block whose address was handed out again (a Cleaner run twice, a second
   * owner) names the old block's tag and is refused: the newer block stays live (issue 23).
   */
  @Test
  void aStaleFreeOfARecycledAddressLeavesTheNewBlockAlone() {
    assertTrue(HugepageBuffers.available(), HugepageBuffers.unavailableReason());
    long live = HugepageBuffers.stats().liveAllocations();
    long a = HpAlloc.alloc0(3 << 20);
    long oldTag = HpAlloc.tag0(a);
    assertTrue(a > 0 && oldTag > 0);
    assertEquals(0, HpAlloc.free0(a, oldTag));
    // The arena hands freed regions out first: usually the same address again.
    long b = HpAlloc.alloc0(3 << 20);
    long newTag = HpAlloc.tag0(b);
    assertTrue(b > 0 && newTag > 0 && newTag != oldTag);
    assertEquals(-ESTALE, HpAlloc.free0(b, oldTag), "a stale free must not free the newer block");
    assertEquals(live + 1, HugepageBuffers.stats().liveAllocations());
    assertEquals(0, HpAlloc.free0(b, newTag));
    assertEquals(live, HugepageBuffers.stats().liveAllocations());
  }
}
