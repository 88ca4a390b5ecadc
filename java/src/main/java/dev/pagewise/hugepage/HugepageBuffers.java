package dev.pagewise.hugepage;

import java.lang.reflect.Constructor;
import java.lang.reflect.Field;
import java.lang.reflect.Method;
import java.nio.Buffer;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.concurrent.atomic.AtomicLong;

/**
 * Direct ByteBuffers on hugepages: the user-space equivalent of the paper's {@code hp_new} for
 * data an application caches itself.
 *
 * <p>Each buffer's memory comes from the hp_alloc arena and goes back to it through the
 * buffer's own Cleaner: when the buffer is unreachable (GC), or at once through {@link #free}
 * — which is what Spark's {@code StorageUtils.dispose} does for the blocks it removes. The
 * buffer is built like Spark's {@code Platform.allocateDirectBuffer}: the JDK's
 * {@code DirectByteBuffer(long, int)} constructor with a {@code jdk.internal.ref.Cleaner} set
 * in its {@code cleaner} field. On JDK 17 that needs {@code --add-opens
 * java.base/java.nio=ALL-UNNAMED --add-opens java.base/jdk.internal.ref=ALL-UNNAMED} (both in
 * Spark's own launcher list); without them {@link #available()} is false and says why.
 */
public final class HugepageBuffers {
  private static final Constructor<?> DBB_CTOR;
  private static final Field DBB_CLEANER;
  private static final Method CLEANER_CREATE;
  private static final Field BUFFER_ADDRESS;
  private static final String UNAVAILABLE;
  private static final AtomicLong ALLOCATED = new AtomicLong();
  private static final AtomicLong FREED = new AtomicLong();

  static {
    Constructor<?> ctor = null;
    Field cleaner = null;
    Method create = null;
    Field address = null;
    String why = HpAlloc.loadError();
    if (why == null) {
      try {
        Class<?> dbb = Class.forName("java.nio.DirectByteBuffer");
        try {
          ctor = dbb.getDeclaredConstructor(long.class, int.class);
        } catch (NoSuchMethodException e) {
          ctor = dbb.getDeclaredConstructor(long.class, long.class); // JDK 21+
        }
        ctor.setAccessible(true);
        cleaner = dbb.getDeclaredField("cleaner");
        cleaner.setAccessible(true);
        Class<?> cl = Class.forName("jdk.internal.ref.Cleaner");
        create = cl.getMethod("create", Object.class, Runnable.class);
        create.setAccessible(true);
        address = Buffer.class.getDeclaredField("address");
        address.setAccessible(true);
      } catch (ReflectiveOperationException | RuntimeException e) {
        why = "cannot build hugepage ByteBuffers (" + e + "); add --add-opens java.base/java.nio=ALL-UNNAMED"
            + " --add-opens java.base/jdk.internal.ref=ALL-UNNAMED to the JVM options";
        ctor = null;
      }
    }
    DBB_CTOR = ctor;
    DBB_CLEANER = cleaner;
    CLEANER_CREATE = create;
    BUFFER_ADDRESS = address;
    UNAVAILABLE = why;
  }

  private HugepageBuffers() {}

  /** Whether buffers can be made on this JVM (native library loaded, JDK internals open). */
  public static boolean available() {
    return UNAVAILABLE == null;
  }

  /** Why {@link #available()} is false; null when it is true. */
  public static String unavailableReason() {
    return UNAVAILABLE;
  }

  /**
   * A direct buffer of {@code size} bytes on hugepage-backed memory (contents unspecified,
   * big-endian like every new ByteBuffer).
   *
   * @throws IllegalArgumentException for a negative size
   * @throws UnsupportedOperationException when {@link #available()} is false
   * @throws OutOfMemoryError when the arena cannot map more memory
   */
  public static ByteBuffer allocate(int size) {
    if (size < 0) {
      throw new IllegalArgumentException("negative buffer size " + size);
    }
    if (UNAVAILABLE != null) {
      throw new UnsupportedOperationException(UNAVAILABLE);
    }
    long addr = HpAlloc.alloc0(Math.max(size, 1));
    if (addr < 0) {
      throw new OutOfMemoryError("hp_alloc(" + size + ") failed: errno " + (-addr));
    }
    // The block's tag: every free names it, so a free that comes late (a Cleaner registered
    // before a failure below, which then runs after this path freed the block and the address
    // went to another buffer) cannot free someone else's memory.
    long tag = HpAlloc.tag0(addr);
    ByteBuffer buf;
    Free free = new Free(addr, tag);
    try {
      buf = (ByteBuffer) DBB_CTOR.newInstance(addr, size);
      DBB_CLEANER.set(buf, CLEANER_CREATE.invoke(null, buf, free));
    } catch (ReflectiveOperationException | RuntimeException e) {
      free.run();
      throw new IllegalStateException("building a hugepage ByteBuffer failed", e);
    }
    ALLOCATED.incrementAndGet();
    return buf;
  }

  /**
   * Give the buffer's memory back now (as Spark's StorageUtils.dispose does). The buffer must
   * not be used afterwards; freeing twice is harmless (a Cleaner runs once).
   *
   * @throws IllegalArgumentException for a buffer not from {@link #allocate}, or a slice of one
   */
  public static void free(ByteBuffer buf) {
    if (UNAVAILABLE != null || !buf.isDirect()) {
      throw new IllegalArgumentException("not a hugepage buffer");
    }
    try {
      Object cleaner = DBB_CLEANER.get(buf);
      if (cleaner == null) {
        throw new IllegalArgumentException("not a hugepage buffer (a slice or duplicate?)");
      }
      cleaner.getClass().getMethod("clean").invoke(cleaner);
    } catch (ReflectiveOperationException e) {
      throw new IllegalStateException("running the buffer's cleaner failed", e);
    }
  }

  private static final class Free implements Runnable {
    private final long addr;
    private final long tag;

    Free(long addr, long tag) {
      this.addr = addr;
      this.tag = tag;
    }

    @Override
    public void run() {
      int rc = HpAlloc.free0(addr, tag);
      if (rc != 0) {
        System.err.println("pagewise: hp_free(0x" + Long.toHexString(addr) + ") failed: errno " + (-rc));
      } else {
        FREED.incrementAndGet();
      }
    }
  }

  /** Buffers made by {@link #allocate} in this JVM. */
  public static long buffersAllocated() {
    return ALLOCATED.get();
  }

  /** Buffers whose memory went back to the arena. */
  public static long buffersFreed() {
    return FREED.get();
  }

  /** The address of a direct buffer (for {@link HpAlloc#adviseHuge0}). */
  public static long addressOf(ByteBuffer direct) {
    if (UNAVAILABLE != null || !direct.isDirect()) {
      throw new IllegalArgumentException("not a direct buffer, or the arena is unavailable");
    }
    try {
      return BUFFER_ADDRESS.getLong(direct);
    } catch (IllegalAccessException e) {
      throw new IllegalStateException(e);
    }
  }

  /** The arena's statistics (hp_stats; reads /proc/self/smaps). */
  public static Stats stats() {
    if (UNAVAILABLE != null) {
      throw new UnsupportedOperationException(UNAVAILABLE);
    }
    ByteBuffer out = ByteBuffer.allocateDirect(96).order(ByteOrder.nativeOrder());
    long addr;
    try {
      addr = BUFFER_ADDRESS.getLong(out);
    } catch (IllegalAccessException e) {
      throw new IllegalStateException(e);
    }
    int rc = HpAlloc.stats0(addr);
    if (rc != 0) {
      throw new IllegalStateException("hp_stats failed: errno " + (-rc));
    }
    return new Stats(out.getLong(0), out.getLong(8), out.getLong(16), out.getLong(24), out.getLong(32),
        out.getLong(40), out.getLong(48), out.getLong(56), out.getLong(64), out.getInt(72));
  }

  /** struct hp_stats (include/pagewise/hp_alloc.h). */
  public record Stats(long requestedBytes, long allocatedBytes, long liveAllocations, long mappedBytes,
      long recycledBytes, long freshBytes, long hugepageBytes, long rssBytes, long collapseFailures, int backing) {
    /** HP_BACKING_* as a word. */
    public String backingName() {
      switch (backing) {
        case 1: return "thp";
        case 2: return "collapse";
        case 3: return "hugetlb";
        default: return "none";
      }
    }
  }
}
