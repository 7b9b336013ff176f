"""The thin Spark adapter: the only package under cep/ that imports pyspark."""
