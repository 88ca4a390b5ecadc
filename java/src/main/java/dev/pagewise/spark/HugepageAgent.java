package dev.pagewise.spark;

import static net.bytebuddy.matcher.ElementMatchers.named;

import dev.pagewise.hugepage.HugepageBuffers;
import java.io.IOException;
import java.lang.instrument.Instrumentation;
import java.util.List;
import net.bytebuddy.agent.ByteBuddyAgent;
import net.bytebuddy.agent.builder.AgentBuilder;
import net.bytebuddy.asm.AsmVisitorWrapper;
import net.bytebuddy.jar.asm.MethodVisitor;
import net.bytebuddy.jar.asm.Opcodes;
import net.bytebuddy.dynamic.ClassFileLocator;

/**
 * The Java agent that puts Spark's Storage Memory on hugepages: inside
 * {@code SerializedValuesHolder} only — the writer of serialized cached blocks
 * (MEMORY_ONLY_SER, MEMORY_AND_DISK_SER, OFF_HEAP) — the chunk allocator is redirected to
 * {@link HugepageStorage}, i.e. to the hp_alloc arena. Execution memory, shuffle buffers,
 * deserialized cached objects and the rest of the heap are untouched.
 *
 * <p>Attach with {@code -javaagent:pagewise-spark.jar} on the driver and executors, or load
 * {@link HugepagePlugin} with {@code spark.plugins} (the jar must then be on
 * {@code spark.driver.extraClassPath} and {@code spark.executor.extraClassPath}, because the
 * rewritten Spark class must see {@link HugepageStorage}). The class file is checked before it
 * is rewritten ({@link SparkClassCheck}); on a Spark whose internals differ, or when the arena
 * is unavailable, the agent stays inactive and says so on stderr (driver and executor logs).
 */
public final class HugepageAgent {
  private static volatile String status = "not installed";
  private static boolean installed;

  private HugepageAgent() {}

  public static void premain(String args, Instrumentation inst) {
    install(inst);
  }

  public static void agentmain(String args, Instrumentation inst) {
    install(inst);
  }

  /** The agent's state in words: "active: ...", "inactive: ...", "pending: ...". */
  public static String status() {
    return status;
  }

  /** Whether SerializedValuesHolder has been rewritten in this JVM. */
  public static boolean active() {
    return status.startsWith("active");
  }

  private static void report(String s) {
    status = s;
    System.err.println("pagewise hugepage agent " + s);
  }

  /** Install into this JVM by self-attach (what the Spark plugin does); idempotent. */
  public static synchronized String ensureInstalled() {
    if (!installed) {
      Instrumentation inst;
      try {
        inst = ByteBuddyAgent.install();
      } catch (IllegalStateException e) {
        report("inactive: cannot attach to this JVM (" + e.getMessage()
            + "); use -javaagent or -Djdk.attach.allowAttachSelf=true");
        return status;
      }
      install(inst);
    }
    return status;
  }

  /** Install with the given Instrumentation; idempotent. */
  public static synchronized void install(Instrumentation inst) {
    if (installed) {
      return;
    }
    installed = true;
    if (!HugepageBuffers.available()) {
      report("inactive: " + HugepageBuffers.unavailableReason());
      return;
    }
    report("pending: waiting for " + SparkClassCheck.CLASS_NAME + " to load");
    new AgentBuilder.Default()
        .disableClassFormatChanges()
        .with(AgentBuilder.RedefinitionStrategy.RETRANSFORMATION)
        .with(AgentBuilder.TypeStrategy.Default.DECORATE)
        .with(AgentBuilder.Listener.StreamWriting.toSystemError().withErrorsOnly())
        .type(named(SparkClassCheck.CLASS_NAME))
        .transform((builder, type, loader, module, domain) -> {
          String problem = check(loader);
          if (problem != null) {
            report("inactive: " + problem);
            return builder;
          }
          builder = builder.visit(new AsmVisitorWrapper.ForDeclaredMethods()
              .method(named("$anonfun$allocator$1").or(named("$anonfun$allocator$2")), REDIRECT));
          report("active: serialized cached blocks (" + SparkClassCheck.CLASS_NAME + ") go to the hp_alloc arena ("
              + HugepageBuffers.stats().backingName() + ")");
          return builder;
        })
        .installOn(inst);
    if (status.startsWith("pending")) {
      System.err.println("pagewise hugepage agent installed; " + SparkClassCheck.CLASS_NAME
          + " is rewritten when Spark loads it");
    }
  }

  private static final String STORAGE = "dev/pagewise/spark/HugepageStorage";
  private static final String ALLOC_DESC = "(I)Ljava/nio/ByteBuffer;";

  /**
   * Inside the two allocator lambdas of SerializedValuesHolder (checked by SparkClassCheck to
   * hold exactly one call each), call HugepageStorage instead of ByteBuffer.allocate and
   * Platform.allocateDirectBuffer. Same descriptor, so the stack and frames are unchanged.
   */
  private static final AsmVisitorWrapper.ForDeclaredMethods.MethodVisitorWrapper REDIRECT =
      (type, method, mv, ctx, pool, writerFlags, readerFlags) -> new MethodVisitor(Opcodes.ASM9, mv) {
        @Override
        public void visitMethodInsn(int op, String owner, String name, String desc, boolean itf) {
          if (op == Opcodes.INVOKESTATIC && desc.equals(ALLOC_DESC) && owner.equals("java/nio/ByteBuffer")
              && name.equals("allocate")) {
            super.visitMethodInsn(op, STORAGE, "allocateOnHeapMode", ALLOC_DESC, false);
          } else if (op == Opcodes.INVOKESTATIC && desc.equals(ALLOC_DESC)
              && owner.equals("org/apache/spark/unsafe/Platform") && name.equals("allocateDirectBuffer")) {
            super.visitMethodInsn(op, STORAGE, "allocateOffHeapMode", ALLOC_DESC, false);
          } else {
            super.visitMethodInsn(op, owner, name, desc, itf);
          }
        }
      };

  /** Null when the class seen by {@code loader} can be rewritten, else why not. */
  static String check(ClassLoader loader) {
    byte[] bytes;
    try {
      bytes = ClassFileLocator.ForClassLoader.of(loader).locate(SparkClassCheck.CLASS_NAME).resolve();
    } catch (IOException | IllegalStateException e) {
      return "cannot read the class file of " + SparkClassCheck.CLASS_NAME + ": " + e;
    }
    List<String> problems = SparkClassCheck.problems(bytes);
    if (!problems.isEmpty()) {
      return "this Spark's " + SparkClassCheck.CLASS_NAME + " differs from Spark 3.5's (" + String.join("; ", problems)
          + "); serialized blocks stay on normal pages";
    }
    try {
      Class<?> seen = Class.forName(HugepageStorage.class.getName(), false, loader);
      if (seen != HugepageStorage.class) {
        return "Spark's class loader sees another copy of " + HugepageStorage.class.getName()
            + "; put the agent jar once on the class path";
      }
    } catch (ClassNotFoundException e) {
      return "Spark's class loader cannot see " + HugepageStorage.class.getName()
          + "; add the jar to spark.driver.extraClassPath and spark.executor.extraClassPath";
    }
    return null;
  }
}
