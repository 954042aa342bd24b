"""Tools on top of every layer: explain, calibration, experiments, rule statistics, the soundness
checker, the fuzzers and the command line. Nothing in eqgrad imports them but the facade."""
