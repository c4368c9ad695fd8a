"""The lab inside other people's trainers: TRL's ``GRPOTrainer`` (``aligntools.integrations.trl``)
and verl batches (``aligntools.integrations.verl``), both writing the audit's rollout records and
the same per-step mismatch statistics (``aligntools.integrations.stats``), and for TRL, whose engine
can live in the trainer's process, minirl's per-site mismatch monitor every K steps
(``aligntools.integrations.monitor``); docs/integrations.md.

Why a package of its own: each trainer's API moves between releases; keeping every call into one
trainer in one module means a release bump touches one file, and the statistics stay identical
across trainers so their curves can be compared.
"""
