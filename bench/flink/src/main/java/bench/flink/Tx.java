package bench.flink;

/** A card transaction, as the fraud generator writes it (cep/datagen/fraud.py). A Flink POJO. */
public class Tx {
    public long ts;
    public String card;
    public double amount;
    public String merchant;
    public String country;

    public Tx() {}
}
