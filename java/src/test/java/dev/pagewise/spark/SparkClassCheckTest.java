package dev.pagewise.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.io.InputStream;
import java.net.URL;
import java.util.List;
import org.junit.jupiter.api.Test;

/** The inactive-on-mismatch path: the agent rewrites only the SerializedValuesHolder it knows. */
class SparkClassCheckTest {
  static byte[] classBytes(String name) throws IOException {
    try (InputStream in = ClassLoader.getSystemResourceAsStream(name.replace('.', '/') + ".class")) {
      return in.readAllBytes();
    }
  }

  @Test
  void theSpark35ClassPasses() throws IOException {
    assertEquals(List.of(), SparkClassCheck.problems(classBytes(SparkClassCheck.CLASS_NAME)));
    assertNull(HugepageAgent.check(ClassLoader.getSystemClassLoader()));
  }

  @Test
  void aDifferentClassIsRefusedWithReasons() throws IOException {
    List<String> p = SparkClassCheck.problems(classBytes("org.apache.spark.util.io.ChunkedByteBufferOutputStream"));
    assertTrue(p.stream().anyMatch(s -> s.contains("not " + SparkClassCheck.CLASS_NAME)), p.toString());
    assertTrue(p.stream().anyMatch(s -> s.contains("Platform.allocateDirectBuffer")), p.toString());
    assertFalse(SparkClassCheck.problems(new byte[] {1, 2, 3}).isEmpty());
  }

  /** A class loader whose SerializedValuesHolder is another class: a Spark with other internals. */
  @Test
  void theAgentStaysInactiveOnAMismatchedSpark() throws IOException {
    byte[] other = classBytes("org.apache.spark.util.io.ChunkedByteBufferOutputStream");
    ClassLoader changed = new ClassLoader(ClassLoader.getSystemClassLoader()) {
      @Override
      public InputStream getResourceAsStream(String name) {
        if (name.equals(SparkClassCheck.CLASS_NAME.replace('.', '/') + ".class")) {
          return new java.io.ByteArrayInputStream(other);
        }
        return super.getResourceAsStream(name);
      }

      @Override
      public URL getResource(String name) {
        return super.getResource(name);
      }
    };
    String why = HugepageAgent.check(changed);
    assertNotNull(why);
    assertTrue(why.contains("differs from Spark 3.5"), why);
  }
}
