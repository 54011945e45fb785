"""The op graph: axes, ops, derivatives, schemas and the reference evaluator."""
