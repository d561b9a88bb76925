"""xtrain.launch: running one training on many GPUs.

    distributed.py  ranks (one thread per GPU, or one process per GPU), gradient all-reduce,
                    the ZeRO-1 sharded AdamW step
    rendezvous.py   how processes find each other (TCP store, shared file, MPI) and stop together
    env.py          the launcher's environment (torchrun, srun, mpirun) read into a LaunchEnv

Layer: imports the engine only; the trainer drives it.
"""
