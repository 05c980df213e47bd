"""Storage: what asyncio_ops writes, byte for byte, and where.

The one container of every blob and checkpoint file (``_container``), signing
(``_signing``), versioned checkpoint files on any filesystem pyarrow reaches
(``_checkpoint_storage``) and the task-local copies of key-group files
(``_local_copies``). It stands on the shared vocabulary only; the state layer,
the engine and the runtime build on it. This ``__init__`` imports nothing:
import the module you need.
"""
