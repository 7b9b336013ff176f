package bench.lucene;

import java.io.BufferedWriter;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Locale;

import org.apache.lucene.analysis.Analyzer;
import org.apache.lucene.analysis.CharArraySet;
import org.apache.lucene.analysis.standard.StandardAnalyzer;
import org.apache.lucene.document.Document;
import org.apache.lucene.document.Field;
import org.apache.lucene.document.LongPoint;
import org.apache.lucene.document.StringField;
import org.apache.lucene.document.TextField;
import org.apache.lucene.monitor.MatchingQueries;
import org.apache.lucene.monitor.Monitor;
import org.apache.lucene.monitor.MonitorConfiguration;
import org.apache.lucene.monitor.MonitorQuery;
import org.apache.lucene.monitor.MultiMatchingQueries;
import org.apache.lucene.monitor.MultipassTermFilteredPresearcher;
import org.apache.lucene.monitor.Presearcher;
import org.apache.lucene.monitor.QueryMatch;
import org.apache.lucene.monitor.TermFilteredPresearcher;
import org.apache.lucene.queryparser.classic.ParseException;
import org.apache.lucene.queryparser.classic.QueryParser;
import org.apache.lucene.search.AutomatonQuery;
import org.apache.lucene.search.BooleanClause;
import org.apache.lucene.search.BooleanQuery;
import org.apache.lucene.search.FuzzyQuery;
import org.apache.lucene.search.Query;
import org.apache.lucene.search.TermQuery;
import org.apache.lucene.index.Term;
import org.apache.lucene.util.automaton.CompiledAutomaton;
import org.apache.lucene.util.Version;

/**
 * Lucene Monitor on the percolator's text workload (bench/percolation.py `text`).
 *
 * <p>Inputs: a queries file (one {@code id<TAB>lucene query} per line) and an events file (one
 * event body per line). Queries are parsed with the classic QueryParser on field "body" with a
 * StandardAnalyzer without stop words, and registered in a Monitor with the chosen presearcher
 * (build_seconds = parse + register; --update-buffer sets the queries per index commit while
 * registering, Lucene's default being 5,000). Then, single-threaded, in the calling thread:
 * match the first {@code --warm-fraction} of the events (warm-up, untimed), then time matching
 * all events, {@code --runs} times; each run is one JSON line on stdout. Documents go to the
 * Monitor in batches of {@code --batch} (Monitor.match(Document[]) over an in-memory index of
 * the batch), or one at a time with {@code --batch 1} (Monitor.match(Document), a MemoryIndex
 * per event).
 * With {@code --matches-out FILE} the (event index, query id) pairs of the first presearcher's
 * last run are written there after timing.
 *
 * <p>{@code --fields title,body,section:keyword,installed_size:long} (the real-corpus workload,
 * bench/apt_corpus.py) makes each events line tab-separated values of those fields: text fields
 * are TextFields (the analyser above), keyword fields StringFields matched whole
 * ({@code section:libs} is a TermQuery), long fields LongPoints (a range on them is
 * {@code LongPoint.newRangeQuery}). The default is one text field "body".
 */
public final class MonitorBench {

    private static final String FIELD = "body";
    /** Event fields in TSV column order: name → "text" | "keyword" | "long". */
    private static String[][] fields = {{FIELD, "text"}};

    private MonitorBench() {
    }

    public static void main(String[] args) {
        int status = 0;
        try {
            run(args);
        } catch (Throwable t) {  // also OutOfMemoryError: never leave the JVM hanging
            t.printStackTrace();
            status = 1;
        }
        System.out.flush();
        System.exit(status);  // no lingering purge thread
    }

    private static void run(String[] args) throws Exception {
        Path queriesPath = null;
        Path eventsPath = null;
        Path matchesOut = null;
        List<String> presearchers = List.of("term");
        int batch = 100;
        int runs = 1;
        int passes = 2;
        double warmFraction = 0.1;
        boolean compiledFuzzy = false;
        int updateBuffer = 0;
        for (int i = 0; i < args.length; i++) {
            String a = args[i];
            switch (a) {
                case "--queries" -> queriesPath = Path.of(args[++i]);
                case "--events" -> eventsPath = Path.of(args[++i]);
                case "--matches-out" -> matchesOut = Path.of(args[++i]);
                case "--presearcher" -> presearchers = List.of(args[++i].split(","));
                case "--batch" -> batch = Integer.parseInt(args[++i]);
                case "--runs" -> runs = Integer.parseInt(args[++i]);
                case "--passes" -> passes = Integer.parseInt(args[++i]);
                case "--warm-fraction" -> warmFraction = Double.parseDouble(args[++i]);
                case "--update-buffer" -> updateBuffer = Integer.parseInt(args[++i]);
                case "--fields" -> fields = parseFields(args[++i]);
                case "--fuzzy" -> compiledFuzzy = switch (args[++i]) {
                    case "stock" -> false;
                    case "compiled" -> true;
                    default -> throw new IllegalArgumentException("--fuzzy stock|compiled");
                };
                default -> throw new IllegalArgumentException("unknown argument: " + a);
            }
        }
        if (queriesPath == null || eventsPath == null) {
            throw new IllegalArgumentException(
                "usage: --queries FILE.tsv --events FILE.txt [--presearcher term,multipass] "
                    + "[--batch N] [--runs N] [--passes N] [--warm-fraction F] "
                    + "[--fuzzy stock|compiled] [--update-buffer N] [--matches-out FILE]");
        }
        if (batch < 1 || runs < 1) {
            throw new IllegalArgumentException("--batch and --runs must be >= 1");
        }

        List<String[]> queries = readQueries(queriesPath);
        List<String> bodies = Files.readAllLines(eventsPath, StandardCharsets.UTF_8);
        int warmCount = Math.max(1, (int) (bodies.size() * warmFraction));

        for (int p = 0; p < presearchers.size(); p++) {
            String name = presearchers.get(p);
            // The first presearcher's last run writes the matches file.
            Path out = p == 0 ? matchesOut : null;
            benchOne(name, passes, compiledFuzzy, updateBuffer, queries, bodies, warmCount,
                     batch, runs, out);
        }
    }

    private static String[][] parseFields(String spec) {
        String[] parts = spec.split(",");
        String[][] out = new String[parts.length][];
        for (int i = 0; i < parts.length; i++) {
            String[] nk = parts[i].split(":", 2);
            String kind = nk.length > 1 ? nk[1] : "text";
            if (!kind.equals("text") && !kind.equals("keyword") && !kind.equals("long")) {
                throw new IllegalArgumentException("field kind text|keyword|long: " + parts[i]);
            }
            out[i] = new String[] {nk[0], kind};
        }
        return out;
    }

    private static String kindOf(String field) {
        for (String[] f : fields) {
            if (f[0].equals(field)) {
                return f[1];
            }
        }
        return "text";
    }

    /** The classic QueryParser, with whole-value keyword fields and LongPoint ranges. */
    private static final class FieldsParser extends QueryParser {
        FieldsParser(Analyzer analyzer) {
            super(FIELD, analyzer);
        }

        @Override
        protected Query getFieldQuery(String field, String text, boolean quoted)
                throws ParseException {
            String kind = kindOf(field);
            if (kind.equals("keyword")) {
                return new TermQuery(new Term(field, text));
            }
            if (kind.equals("long")) {
                long v = Long.parseLong(text);
                return LongPoint.newExactQuery(field, v);
            }
            return super.getFieldQuery(field, text, quoted);
        }

        @Override
        protected Query getRangeQuery(String field, String part1, String part2,
                                      boolean startInclusive, boolean endInclusive)
                throws ParseException {
            if (!kindOf(field).equals("long")) {
                return super.getRangeQuery(field, part1, part2, startInclusive, endInclusive);
            }
            long lo = part1 == null || part1.equals("*") ? Long.MIN_VALUE
                : Long.parseLong(part1) + (startInclusive ? 0 : 1);
            long hi = part2 == null || part2.equals("*") ? Long.MAX_VALUE
                : Long.parseLong(part2) - (endInclusive ? 0 : 1);
            return LongPoint.newRangeQuery(field, lo, hi);
        }
    }

    private static List<String[]> readQueries(Path path) throws IOException {
        List<String[]> out = new ArrayList<>();
        for (String line : Files.readAllLines(path, StandardCharsets.UTF_8)) {
            if (line.isEmpty()) {
                continue;
            }
            int tab = line.indexOf('\t');
            if (tab < 0) {
                throw new IllegalArgumentException("query line without a tab: " + line);
            }
            out.add(new String[] {line.substring(0, tab), line.substring(tab + 1)});
        }
        return out;
    }

    private static Analyzer analyzer() {
        // Lowercasing UAX#29 tokenizer, no stop words: the percolator's analyser on ASCII words.
        return new StandardAnalyzer(CharArraySet.EMPTY_SET);
    }

    private static Presearcher presearcher(String name, int passes) {
        return switch (name) {
            case "term" -> new TermFilteredPresearcher();
            case "multipass" -> new MultipassTermFilteredPresearcher(passes);
            default -> throw new IllegalArgumentException("unknown presearcher: " + name);
        };
    }

    /**
     * With --fuzzy compiled, a FuzzyQuery (top level or a clause of a BooleanQuery) becomes an
     * AutomatonQuery over the same Levenshtein automaton (same edits, prefix length and
     * transpositions), compiled once here: a stock FuzzyQuery rebuilds its automaton every time
     * it runs, i.e. once per query per document (or batch) in the Monitor. The only semantic
     * difference is FuzzyQuery's 50-term expansion cap, which a ~100-token event never reaches.
     */
    private static Query compileFuzzy(Query q) {
        if (q instanceof FuzzyQuery fq) {
            CompiledAutomaton ca = FuzzyQuery.getFuzzyAutomaton(fq.getTerm().text(),
                fq.getMaxEdits(), fq.getPrefixLength(), fq.getTranspositions());
            return new AutomatonQuery(fq.getTerm(), ca.automaton);
        }
        if (q instanceof BooleanQuery bq) {
            BooleanQuery.Builder b = new BooleanQuery.Builder();
            b.setMinimumNumberShouldMatch(bq.getMinimumNumberShouldMatch());
            for (BooleanClause c : bq.clauses()) {
                b.add(compileFuzzy(c.getQuery()), c.getOccur());
            }
            return b.build();
        }
        return q;
    }

    private static void benchOne(String name, int passes, boolean compiledFuzzy, int updateBuffer,
                                 List<String[]> queries,
                                 List<String> bodies, int warmCount, int batch, int runs,
                                 Path matchesOut) throws IOException {
        Analyzer analyzer = analyzer();
        long t0 = System.nanoTime();
        QueryParser parser = new FieldsParser(analyzer);
        List<MonitorQuery> mqs = new ArrayList<>(queries.size());
        int parseErrors = 0;
        for (String[] q : queries) {
            try {
                Query query = parser.parse(q[1]);
                if (compiledFuzzy) {
                    query = compileFuzzy(query);
                }
                mqs.add(new MonitorQuery(q[0], query, q[1], java.util.Map.of()));
            } catch (ParseException e) {
                parseErrors++;
            }
        }
        double parseSeconds = (System.nanoTime() - t0) / 1e9;
        MonitorConfiguration config = new MonitorConfiguration();
        if (updateBuffer > 0) {  // queries per index commit while registering (Lucene: 5,000)
            config.setQueryUpdateBufferSize(updateBuffer);
        }
        Monitor monitor = new Monitor(analyzer, presearcher(name, passes), config);
        monitor.register(mqs);
        double buildSeconds = (System.nanoTime() - t0) / 1e9;
        String presearcherName = name.equals("multipass")
            ? "MultipassTermFilteredPresearcher(" + passes + ")" : "TermFilteredPresearcher";

        match(monitor, bodies.subList(0, warmCount), batch, null);  // warm-up, untimed
        for (int r = 0; r < runs; r++) {
            List<List<String>> perEvent = new ArrayList<>(bodies.size());
            long[] counters = new long[3];  // matches, queries run, match calls
            long s0 = System.nanoTime();
            long errors = match(monitor, bodies, batch, perEvent, counters);
            double seconds = (System.nanoTime() - s0) / 1e9;
            boolean last = r == runs - 1;
            if (last && matchesOut != null) {
                writeMatches(matchesOut, perEvent);
            }
            StringBuilder sb = new StringBuilder(512);
            sb.append('{');
            kv(sb, "engine", "lucene-monitor").append(',');
            kv(sb, "lucene_version", Version.LATEST.toString()).append(',');
            kv(sb, "presearcher", presearcherName).append(',');
            kv(sb, "fuzzy", compiledFuzzy ? "compiled" : "stock").append(',');
            kv(sb, "run", r + 1).append(',');
            kv(sb, "events", bodies.size()).append(',');
            kv(sb, "queries", mqs.size()).append(',');
            kv(sb, "parse_errors", parseErrors).append(',');
            kv(sb, "disjuncts", monitor.getDisjunctCount()).append(',');
            kv(sb, "build_seconds", buildSeconds).append(',');
            kv(sb, "parse_seconds", parseSeconds).append(',');
            kv(sb, "warm_events", warmCount).append(',');
            kv(sb, "batch", batch).append(',');
            kv(sb, "threads", 1).append(',');
            kv(sb, "seconds", seconds).append(',');
            kv(sb, "events_per_s", bodies.size() / seconds).append(',');
            kv(sb, "matches", counters[0]).append(',');
            kv(sb, "match_errors", errors).append(',');
            kv(sb, "match_calls", counters[2]).append(',');
            kv(sb, "queries_run", counters[1]).append(',');
            kv(sb, "queries_run_per_call", (double) counters[1] / counters[2]).append(',');
            kv(sb, "queries_run_per_call_fraction",
                (double) counters[1] / counters[2] / Math.max(1, mqs.size()));
            sb.append('}');
            System.out.println(sb);
            System.out.flush();
        }
        monitor.close();
    }

    private static void match(Monitor monitor, List<String> bodies, int batch,
                              List<List<String>> perEvent) throws IOException {
        match(monitor, bodies, batch, perEvent, new long[3]);
    }

    /** Match all bodies; fills perEvent (query ids per event) if not null; returns errors. */
    private static long match(Monitor monitor, List<String> bodies, int batch,
                              List<List<String>> perEvent, long[] counters) throws IOException {
        long errors = 0;
        int n = bodies.size();
        for (int start = 0; start < n; start += batch) {
            int end = Math.min(n, start + batch);
            if (batch == 1) {
                MatchingQueries<QueryMatch> m = monitor.match(doc(bodies.get(start)),
                                                              QueryMatch.SIMPLE_MATCHER);
                counters[0] += m.getMatchCount();
                counters[1] += m.getQueriesRun();
                counters[2]++;
                errors += m.getErrors().size();
                if (perEvent != null) {
                    perEvent.add(ids(m.getMatches()));
                }
            } else {
                Document[] docs = new Document[end - start];
                for (int i = start; i < end; i++) {
                    docs[i - start] = doc(bodies.get(i));
                }
                MultiMatchingQueries<QueryMatch> m = monitor.match(docs,
                                                                   QueryMatch.SIMPLE_MATCHER);
                counters[1] += m.getQueriesRun();
                counters[2]++;
                errors += m.getErrors().size();
                for (int i = 0; i < docs.length; i++) {
                    counters[0] += m.getMatchCount(i);
                    if (perEvent != null) {
                        perEvent.add(ids(m.getMatches(i)));
                    }
                }
            }
        }
        return errors;
    }

    private static Document doc(String line) {
        Document d = new Document();
        if (fields.length == 1) {
            d.add(new TextField(FIELD, line, Field.Store.NO));
            return d;
        }
        String[] cols = line.split("\t", -1);
        for (int i = 0; i < fields.length && i < cols.length; i++) {
            String name = fields[i][0];
            switch (fields[i][1]) {
                case "keyword" -> d.add(new StringField(name, cols[i], Field.Store.NO));
                case "long" -> d.add(new LongPoint(name, Long.parseLong(cols[i])));
                default -> d.add(new TextField(name, cols[i], Field.Store.NO));
            }
        }
        return d;
    }

    private static List<String> ids(Collection<QueryMatch> matches) {
        List<String> out = new ArrayList<>(matches.size());
        for (QueryMatch qm : matches) {
            out.add(qm.getQueryId());
        }
        return out;
    }

    private static void writeMatches(Path path, List<List<String>> perEvent) throws IOException {
        try (BufferedWriter w = Files.newBufferedWriter(path, StandardCharsets.UTF_8)) {
            for (int i = 0; i < perEvent.size(); i++) {
                for (String id : perEvent.get(i)) {
                    w.write(Integer.toString(i));
                    w.write('\t');
                    w.write(id);
                    w.write('\n');
                }
            }
        }
    }

    private static StringBuilder kv(StringBuilder sb, String key, String value) {
        sb.append('"').append(key).append("\":\"");
        for (char c : value.toCharArray()) {
            if (c == '"' || c == '\\') {
                sb.append('\\');
            }
            sb.append(c);
        }
        return sb.append('"');
    }

    private static StringBuilder kv(StringBuilder sb, String key, long value) {
        return sb.append('"').append(key).append("\":").append(value);
    }

    private static StringBuilder kv(StringBuilder sb, String key, double value) {
        return sb.append('"').append(key).append("\":")
            .append(String.format(Locale.ROOT, "%.6g", value));
    }
}
