package bench.flink;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.BufferedReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import org.apache.flink.api.common.accumulators.LongCounter;
import org.apache.flink.api.common.accumulators.LongMinimum;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.streaming.api.functions.source.RichParallelSourceFunction;

/**
 * Reads the JSON-lines files of one folder and parses each line into a {@link Tx}.
 *
 * <p>Subtask i of p reads the files i, i+p, i+2p ... in name order. The generator writes the
 * events in time order split over the files, so every subtask emits non-decreasing timestamps
 * and a bounded-out-of-orderness watermark behind it never declares an event late.
 */
public class JsonLinesSource extends RichParallelSourceFunction<Tx> {
    private final List<String> files;
    private volatile boolean running = true;
    private transient LongCounter events;
    private transient LongMinimum firstEventMs;

    public JsonLinesSource(List<String> files) {
        this.files = files;
    }

    @Override
    public void open(Configuration parameters) {
        events = getRuntimeContext().getLongCounter("events");
        firstEventMs = new LongMinimum();
        getRuntimeContext().addAccumulator("first_event_ms", firstEventMs);
    }

    @Override
    public void run(SourceContext<Tx> ctx) throws Exception {
        int me = getRuntimeContext().getTaskInfo().getIndexOfThisSubtask();
        int p = getRuntimeContext().getTaskInfo().getNumberOfParallelSubtasks();
        ObjectMapper json = new ObjectMapper();
        firstEventMs.add(System.currentTimeMillis());
        for (int i = me; i < files.size() && running; i += p) {
            try (BufferedReader in = Files.newBufferedReader(Path.of(files.get(i)),
                    StandardCharsets.UTF_8)) {
                String line;
                while (running && (line = in.readLine()) != null) {
                    if (line.isBlank()) {
                        continue;
                    }
                    JsonNode n = json.readTree(line);
                    Tx tx = new Tx();
                    tx.ts = n.get("ts").asLong();
                    tx.card = n.get("card").asText();
                    tx.amount = n.get("amount").asDouble();
                    tx.merchant = n.path("merchant").asText();
                    tx.country = n.path("country").asText();
                    synchronized (ctx.getCheckpointLock()) {
                        ctx.collect(tx);
                    }
                    events.add(1L);
                }
            }
        }
    }

    @Override
    public void cancel() {
        running = false;
    }
}
