"""Names and tensors between the kernel and its ranks: which names a cell uses, ``--share`` and
``--out`` (``_names``), over shared memory without pickle copies of tensor data (``_shm``)."""
