import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.Arrays;
import java.util.Random;
import java.util.concurrent.atomic.AtomicLong;
import org.wso2.siddhi.core.SiddhiAppRuntime;
import org.wso2.siddhi.core.SiddhiManager;
import org.wso2.siddhi.core.event.Event;
import org.wso2.siddhi.core.stream.input.InputHandler;
import org.wso2.siddhi.core.stream.output.StreamCallback;

/**
 * Siddhi's events/s for one app with single-event sends: args app-file events runs streams slice.
 * With two more args, input-file output-file, it sends the input file's events instead (lines of
 * stream-index, timestamp, symbol, price, volume, tab-separated) once and writes every event Out
 * receives to the output file (timestamp, then its values, tab-separated).
 */
public class SiddhiBench {
    public static void main(String[] args) throws Exception {
        if (args.length > 5) {
            replay(new String(Files.readAllBytes(Paths.get(args[0]))), args[3].split(","), args[5], args[6]);
            return;
        }
        String app = new String(Files.readAllBytes(Paths.get(args[0])));
        int events = Integer.parseInt(args[1]);
        int runs = Integer.parseInt(args[2]);
        String[] streams = args[3].split(",");
        int slice = Integer.parseInt(args[4]);
        Object[][] rows = new Object[events][];
        Random random = new Random(7);
        for (int i = 0; i < events; i++) {
            rows[i] = new Object[] {"S" + (i % 100), 100.0 + random.nextDouble() * 100.0, (long) (1 + random.nextInt(999))};
        }
        double[] rates = new double[runs];
        long outputs = 0;
        SiddhiManager manager = new SiddhiManager();
        for (int run = 0; run < runs; run++) {
            SiddhiAppRuntime runtime = manager.createSiddhiAppRuntime(app);
            AtomicLong seen = new AtomicLong();
            runtime.addCallback("Out", new StreamCallback() {
                @Override
                public void receive(Event[] out) {
                    seen.addAndGet(out.length);
                }
            });
            InputHandler[] handlers = new InputHandler[streams.length];
            for (int s = 0; s < streams.length; s++) {
                handlers[s] = runtime.getInputHandler(streams[s]);
            }
            runtime.start();
            long start = System.nanoTime();
            for (int i = 0; i < events; i++) {
                handlers[(i / slice) % streams.length].send(1_700_000_000_000L + i, rows[i]);
            }
            long nanos = System.nanoTime() - start;
            runtime.shutdown();
            rates[run] = events / (nanos / 1e9);
            outputs = seen.get();
        }
        manager.shutdown();
        Arrays.sort(rates);
        System.out.println("{\"events_per_s\": " + Math.round(rates[runs / 2]) + ", \"min\": " + Math.round(rates[0])
            + ", \"max\": " + Math.round(rates[runs - 1]) + ", \"runs\": " + runs + ", \"outputs\": " + outputs + "}");
    }

    static void replay(String app, String[] streams, String input, String output) throws Exception {
        SiddhiManager manager = new SiddhiManager();
        SiddhiAppRuntime runtime = manager.createSiddhiAppRuntime(app);
        StringBuilder out = new StringBuilder();
        runtime.addCallback("Out", new StreamCallback() {
            @Override
            public void receive(Event[] events) {
                for (Event event : events) {
                    out.append(event.getTimestamp());
                    for (Object value : event.getData()) {
                        out.append('\t').append(value);
                    }
                    out.append('\n');
                }
            }
        });
        InputHandler[] handlers = new InputHandler[streams.length];
        for (int s = 0; s < streams.length; s++) {
            handlers[s] = runtime.getInputHandler(streams[s]);
        }
        runtime.start();
        for (String line : Files.readAllLines(Paths.get(input))) {
            String[] f = line.split("\t");
            handlers[Integer.parseInt(f[0])].send(Long.parseLong(f[1]), new Object[] {f[2], Double.parseDouble(f[3]), Long.parseLong(f[4])});
        }
        runtime.shutdown();
        manager.shutdown();
        Files.write(Paths.get(output), out.toString().getBytes());
    }
}
