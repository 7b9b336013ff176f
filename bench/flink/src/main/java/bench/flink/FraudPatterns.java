package bench.flink;

import java.time.Duration;
import java.util.LinkedHashMap;
import java.util.Map;
import org.apache.flink.cep.nfa.aftermatch.AfterMatchSkipStrategy;
import org.apache.flink.cep.pattern.Pattern;
import org.apache.flink.cep.pattern.conditions.IterativeCondition;
import org.apache.flink.cep.pattern.conditions.SimpleCondition;

/**
 * tests/runtime/rules/fraud.cep in Flink's Pattern API. Our rules default to strict contiguity
 * (MATCH_RECOGNIZE: {@code (A B)} means B is the next event of the key), greedy quantifiers
 * and AFTER MATCH SKIP PAST LAST ROW; the Flink equivalents are {@code next()},
 * {@code consecutive()}, {@code greedy()} and {@code skipPastLastEvent()}.
 */
final class FraudPatterns {
    private FraudPatterns() {}

    static Map<String, Pattern<Tx, ?>> all() {
        Map<String, Pattern<Tx, ?>> out = new LinkedHashMap<>();
        out.put("card_testing", cardTesting());
        out.put("velocity", velocity());
        out.put("impossible_travel", impossibleTravel());
        return out;
    }

    /** PATTERN (T{3,} L) DEFINE T AS amount < 2.00, L AS amount >= 500 WITHIN 10m. */
    static Pattern<Tx, ?> cardTesting() {
        return Pattern.<Tx>begin("T", AfterMatchSkipStrategy.skipPastLastEvent())
                .where(new SimpleCondition<Tx>() {
                    @Override
                    public boolean filter(Tx tx) {
                        return tx.amount < 2.00;
                    }
                })
                .timesOrMore(3).consecutive().greedy()
                .next("L")
                .where(new SimpleCondition<Tx>() {
                    @Override
                    public boolean filter(Tx tx) {
                        return tx.amount >= 500;
                    }
                })
                .within(Duration.ofMinutes(10));
    }

    /** PATTERN (A{5}) WITHIN 1m: five consecutive charges of a card within a minute. */
    static Pattern<Tx, ?> velocity() {
        return Pattern.<Tx>begin("A", AfterMatchSkipStrategy.skipPastLastEvent())
                .times(5).consecutive()
                .within(Duration.ofMinutes(1));
    }

    /** PATTERN (A B) DEFINE B AS B.country <> A.country WITHIN 1h. */
    static Pattern<Tx, ?> impossibleTravel() {
        return Pattern.<Tx>begin("A", AfterMatchSkipStrategy.skipPastLastEvent())
                .next("B")
                .where(new IterativeCondition<Tx>() {
                    @Override
                    public boolean filter(Tx tx, Context<Tx> ctx) throws Exception {
                        for (Tx a : ctx.getEventsForPattern("A")) {
                            if (a.country.equals(tx.country)) {
                                return false;
                            }
                        }
                        return true;
                    }
                })
                .within(Duration.ofHours(1));
    }
}
