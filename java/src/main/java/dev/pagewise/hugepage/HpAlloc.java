package dev.pagewise.hugepage;

import java.io.IOException;
import java.io.InputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;

/**
 * The JNI binding to the hp_alloc arena of libpagewise (crates/hugepage/src/hp_alloc_capi.rs).
 *
 * <p>The native functions take and return plain longs: addresses, or a negative errno. The
 * library is loaded from the system property {@code pagewise.native.lib} when set, otherwise
 * from the copy of libpagewise.so packed in this jar (extracted to a temporary file), so an
 * executor needs nothing installed. When loading fails, {@link #loadError()} says why and every
 * caller stays on its normal path.
 */
public final class HpAlloc {
  private static final String RESOURCE = "/dev/pagewise/native/linux-x86_64/libpagewise.so";
  private static final String LOAD_ERROR = load();

  private HpAlloc() {}

  private static String load() {
    try {
      String explicit = System.getProperty("pagewise.native.lib");
      if (explicit != null && !explicit.isEmpty()) {
        System.load(explicit);
        return null;
      }
      if (!"amd64".equals(System.getProperty("os.arch")) || !"Linux".equals(System.getProperty("os.name"))) {
        return "libpagewise is packed for Linux x86-64 only (this is "
            + System.getProperty("os.name") + "/" + System.getProperty("os.arch") + ")";
      }
      try (InputStream in = HpAlloc.class.getResourceAsStream(RESOURCE)) {
        if (in == null) {
          return "libpagewise.so is not in the jar (" + RESOURCE + "); build with `make java`";
        }
        Path tmp = Files.createTempFile("libpagewise-", ".so");
        Files.copy(in, tmp, StandardCopyOption.REPLACE_EXISTING);
        System.load(tmp.toString());
        // The mapping stays valid after the name is gone.
        Files.deleteIfExists(tmp);
      }
      return null;
    } catch (IOException | UnsatisfiedLinkError | SecurityException e) {
      return "loading libpagewise failed: " + e;
    }
  }

  /** Null when the native library is loaded, else the reason it is not. */
  public static String loadError() {
    return LOAD_ERROR;
  }

  /** hp_alloc(size): the address, or -errno. */
  static native long alloc0(long size);

  /** The tag of the live allocation at addr (take it right after alloc0), or -errno. */
  static native long tag0(long addr);

  /**
   * hp_free_tagged(addr, tag): frees the allocation at addr only if it is the one tagged tag;
   * 0, -ESTALE (116) for a stale free — that block is gone and its address holds a newer one,
   * which is left alone — or another -errno.
   */
  static native int free0(long addr, long tag);

  /** hp_stats into the struct hp_stats at outAddr: 0 or -errno. */
  static native int stats0(long outAddr);

  /** MADV_HUGEPAGE on the whole 2 MiB regions inside [addr, addr+len): bytes advised or -errno. */
  public static native long adviseHuge0(long addr, long len);
}
