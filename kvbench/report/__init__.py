"""Results schema, run directories, tables and plots."""
