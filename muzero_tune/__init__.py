"""muzero_tune: MuZero-family training with sync and async segment pipelines."""
