"""xtrain.io: what a run leaves on disk and reads back.

    state.py   checkpoints: save/load of model, optimizer, RNG and loader state (safetensors + JSON)
    schema.py  the checks every checkpoint file passes before anything is allocated
    export.py  a checkpoint as a Hugging Face directory (transformers loads it)
    llmc.py    llm.c's GPT-2 model file (float32 and bfloat16), read and written
    rundir.py  run directories: the run's lock, claiming a folder for a run, staged writes

Reading a Hugging Face directory is the model's own mapping (xtrain.models.hf_import).
Layer: imports the engine, xtrain.data and xtrain.models; never the trainer or the launchers.
"""
