"""The small-width search: Ray Tune trials over widths × the hyperparameter grid."""
