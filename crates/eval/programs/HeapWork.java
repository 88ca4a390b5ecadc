// A JVM program for the compatibility tests and `pagewise eval hps-programs`: it fills a
// long[][] of MIB MiB on the Java heap (seeded values), sums it ROUNDS times in a scattered
// order and prints the sums; the same numbers in every run. With a trailing "wait" it then
// reads a line from stdin before exiting, so a test can look at the process while its heap is
// still mapped. Usage: java HeapWork.java MIB ROUNDS [wait]
public class HeapWork {
    public static void main(String[] args) throws Exception {
        int mib = Integer.parseInt(args[0]);
        int rounds = Integer.parseInt(args[1]);
        int rows = mib * 2; // rows of 512 KiB
        long[][] heap = new long[rows][65536];
        long seed = 42;
        for (long[] row : heap) {
            for (int i = 0; i < row.length; i++) {
                seed = seed * 6364136223846793005L + 1442695040888963407L;
                row[i] = seed >>> 17;
            }
        }
        for (int r = 0; r < rounds; r++) {
            long sum = 0;
            long k = r;
            for (int j = 0; j < rows * 65536 / 4; j++) {
                k = (k * 2862933555777941757L + 3037000493L);
                int at = (int) ((k >>> 20) % ((long) rows * 65536));
                sum += heap[at >>> 16][at & 65535];
            }
            System.out.println("round " + r + " " + sum);
        }
        System.out.flush();
        if (args.length > 2 && args[2].equals("wait")) {
            System.in.read();
        }
    }
}
