"""xtrain.trainer: what turns a model and data into a run.

    train.py      TrainConfig and the training loop (train, the data-parallel and per-process forms)
    cli.py        the `xtrain` command line (train, prepare, sample, export)
    runconfig.py  a run's recorded configuration (config.toml), TOML reading and validation
    batching.py   the batch plan: micro-batch, accumulation, recompute, --batch auto
    schedule.py   learning-rate schedules (cosine, WSD, constant)
    trackers.py   metric sinks beside log.jsonl (TensorBoard, Weights & Biases)

Layer: imports the engine, xtrain.data, xtrain.models, xtrain.io and xtrain.launch; nothing
imports it (tests/test_structure.py keeps it so).
"""
