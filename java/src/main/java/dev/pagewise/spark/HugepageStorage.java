package dev.pagewise.spark;

import dev.pagewise.hugepage.HugepageBuffers;
import java.nio.ByteBuffer;
import java.util.concurrent.atomic.AtomicLong;

/**
 * The allocators the agent puts in place of {@code ByteBuffer.allocate} (ON_HEAP) and
 * {@code Platform.allocateDirectBuffer} (OFF_HEAP) inside Spark's
 * {@code SerializedValuesHolder}, i.e. for the chunks of serialized cached blocks only.
 *
 * <p>Both return a hugepage buffer from the hp_alloc arena; Spark frees it with its own
 * {@code StorageUtils.dispose} when the block is removed (unpersist, eviction, failed unroll).
 * When the arena cannot give memory the original allocator is used and the fallback counted, so
 * caching never fails because of hugepages.
 */
public final class HugepageStorage {
  /**
   * {@code -Dpagewise.storage=old}: the paper's first prototype ("hugepage-part-old"), kept as
   * the experiment's baseline: chunks come from Spark's normal off-heap allocator and a scanner
   * thread advises them MADV_HUGEPAGE after the fact, once a second; khugepaged promotes them
   * later, at its own pace.
   */
  static final boolean OLD = "old".equals(System.getProperty("pagewise.storage"));
  private static final java.util.concurrent.ConcurrentLinkedQueue<java.lang.ref.WeakReference<ByteBuffer>> SCAN =
      new java.util.concurrent.ConcurrentLinkedQueue<>();
  private static final AtomicLong ADVISED = new AtomicLong();

  static {
    if (OLD) {
      Thread t = new Thread(HugepageStorage::scanLoop, "pagewise-storage-scanner");
      t.setDaemon(true);
      t.start();
    }
  }

  private static void scanLoop() {
    while (true) {
      try {
        Thread.sleep(1000);
      } catch (InterruptedException e) {
        return;
      }
      java.lang.ref.WeakReference<ByteBuffer> ref;
      while ((ref = SCAN.poll()) != null) {
        ByteBuffer b = ref.get();
        if (b != null) {
          long n = dev.pagewise.hugepage.HpAlloc.adviseHuge0(HugepageBuffers.addressOf(b), b.capacity());
          if (n > 0) {
            ADVISED.addAndGet(n);
          }
        }
      }
    }
  }

  /** Bytes the old-mode scanner advised MADV_HUGEPAGE. */
  public static long bytesAdvised() {
    return ADVISED.get();
  }

  private static ByteBuffer old(int size) {
    ByteBuffer b = org.apache.spark.unsafe.Platform.allocateDirectBuffer(size);
    SCAN.add(new java.lang.ref.WeakReference<>(b));
    CHUNKS.incrementAndGet();
    BYTES.addAndGet(size);
    return b;
  }

  private static final AtomicLong BYTES = new AtomicLong();
  private static final AtomicLong CHUNKS = new AtomicLong();
  private static final AtomicLong FALLBACKS = new AtomicLong();

  private HugepageStorage() {}

  /** Replaces {@code ByteBuffer.allocate(size)} in SerializedValuesHolder. */
  public static ByteBuffer allocateOnHeapMode(int size) {
    if (OLD) {
      return old(size);
    }
    ByteBuffer b = tryHuge(size);
    return b != null ? b : ByteBuffer.allocate(size);
  }

  /** Replaces {@code Platform.allocateDirectBuffer(size)} in SerializedValuesHolder. */
  public static ByteBuffer allocateOffHeapMode(int size) {
    if (OLD) {
      return old(size);
    }
    ByteBuffer b = tryHuge(size);
    return b != null ? b : org.apache.spark.unsafe.Platform.allocateDirectBuffer(size);
  }

  private static ByteBuffer tryHuge(int size) {
    try {
      ByteBuffer b = HugepageBuffers.allocate(size);
      BYTES.addAndGet(size);
      CHUNKS.incrementAndGet();
      return b;
    } catch (OutOfMemoryError | RuntimeException e) {
      if (FALLBACKS.getAndIncrement() == 0) {
        System.err.println("pagewise: hugepage storage chunk of " + size + " bytes fell back to the normal"
            + " allocator: " + e + " (reported once)");
      }
      return null;
    }
  }

  /** Bytes of storage chunks placed on hugepages so far (not net of frees). */
  public static long bytesPlaced() {
    return BYTES.get();
  }

  /** Storage chunks placed on hugepages so far. */
  public static long chunksPlaced() {
    return CHUNKS.get();
  }

  /** Chunks that went to the normal allocator because the arena failed. */
  public static long fallbacks() {
    return FALLBACKS.get();
  }
}
