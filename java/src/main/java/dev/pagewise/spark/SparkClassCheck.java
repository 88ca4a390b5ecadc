package dev.pagewise.spark;

import java.util.ArrayList;
import java.util.List;
import net.bytebuddy.jar.asm.ClassReader;
import net.bytebuddy.jar.asm.ClassVisitor;
import net.bytebuddy.jar.asm.MethodVisitor;
import net.bytebuddy.jar.asm.Opcodes;

/**
 * Checks that a class file is the {@code SerializedValuesHolder} the agent knows how to rewrite
 * (Spark 3.5: {@code core/src/main/scala/org/apache/spark/storage/memory/MemoryStore.scala}):
 * the five-argument constructor that builds a {@code ChunkedByteBufferOutputStream(int,
 * Function1)} and exactly one call each of {@code ByteBuffer.allocate(int)} and
 * {@code Platform.allocateDirectBuffer(int)} (the two allocator lambdas). Anything else means a
 * Spark whose internals differ, and the agent stays inactive rather than guess.
 */
public final class SparkClassCheck {
  public static final String CLASS_NAME = "org.apache.spark.storage.memory.SerializedValuesHolder";
  static final String CTOR_DESC = "(Lorg/apache/spark/storage/BlockId;ILscala/reflect/ClassTag;"
      + "Lorg/apache/spark/memory/MemoryMode;Lorg/apache/spark/serializer/SerializerManager;)V";

  private SparkClassCheck() {}

  /** The problems found; empty when the class is the expected one. */
  public static List<String> problems(byte[] classFile) {
    List<String> out = new ArrayList<>();
    int[] counts = new int[3]; // allocate, allocateDirectBuffer, ChunkedByteBufferOutputStream.<init> in ctor
    boolean[] ctor = new boolean[1];
    String[] name = new String[1];
    try {
      new ClassReader(classFile).accept(new ClassVisitor(Opcodes.ASM9) {
        @Override
        public void visit(int v, int access, String n, String sig, String sup, String[] itf) {
          name[0] = n.replace('/', '.');
        }

        @Override
        public MethodVisitor visitMethod(int access, String mname, String desc, String sig, String[] exc) {
          boolean isCtor = mname.equals("<init>") && desc.equals(CTOR_DESC);
          ctor[0] |= isCtor;
          return new MethodVisitor(Opcodes.ASM9) {
            @Override
            public void visitMethodInsn(int op, String owner, String m, String d, boolean itf) {
              if (op == Opcodes.INVOKESTATIC && owner.equals("java/nio/ByteBuffer") && m.equals("allocate")
                  && d.equals("(I)Ljava/nio/ByteBuffer;")) {
                counts[0]++;
              } else if (op == Opcodes.INVOKESTATIC && owner.equals("org/apache/spark/unsafe/Platform")
                  && m.equals("allocateDirectBuffer") && d.equals("(I)Ljava/nio/ByteBuffer;")) {
                counts[1]++;
              } else if (isCtor && op == Opcodes.INVOKESPECIAL
                  && owner.equals("org/apache/spark/util/io/ChunkedByteBufferOutputStream")
                  && m.equals("<init>") && d.equals("(ILscala/Function1;)V")) {
                counts[2]++;
              }
            }
          };
        }
      }, ClassReader.SKIP_DEBUG | ClassReader.SKIP_FRAMES);
    } catch (RuntimeException e) {
      out.add("cannot read the class file: " + e);
      return out;
    }
    if (!CLASS_NAME.equals(name[0])) {
      out.add("class is " + name[0] + ", not " + CLASS_NAME);
    }
    if (!ctor[0]) {
      out.add("no constructor " + CTOR_DESC);
    }
    if (counts[2] != 1) {
      out.add("constructor builds ChunkedByteBufferOutputStream(int, Function1) " + counts[2] + " times, expected 1");
    }
    if (counts[0] != 1) {
      out.add("ByteBuffer.allocate(int) called " + counts[0] + " times, expected 1 (the ON_HEAP allocator)");
    }
    if (counts[1] != 1) {
      out.add("Platform.allocateDirectBuffer(int) called " + counts[1] + " times, expected 1 (the OFF_HEAP allocator)");
    }
    return out;
  }
}
