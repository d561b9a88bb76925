"""xtrain.trainer: what turns a model and data into a run.

    train.py      the training loop (train, the data-parallel and per-process forms)
    cli.py        the `xtrain` command line (train, prepare, sample, export)
    runconfig.py  TrainConfig (its fields make train's flags), the machine defaults, config files,
                  the record of a run (config.toml), the check of every value
    batching.py   the batch plan: micro-batch, accumulation, recompute, --batch auto
    schedule.py   learning-rate schedules (cosine, WSD, constant)
    trackers.py   metric sinks beside log.jsonl (TensorBoard, Weights & Biases)

Layer: imports the engine, xtrain.data, xtrain.models, xtrain.io and xtrain.launch; nothing
imports it (tests/test_structure.py keeps it so).
"""
