"""Many runs of the application: one per seed (`seeds`), strategies side by side (`compare`), and
Optuna studies over run settings (`sweep`, with its config, pruning and reports). Each member is
an ordinary `experiments.run.execute` run in its own folder."""
