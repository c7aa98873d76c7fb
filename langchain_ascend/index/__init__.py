"""Vector search building blocks behind :class:`~langchain_ascend.vectorstores.AscendFAISS`.

* :mod:`.device_index` - exact (flat) search as device tensors.
* :mod:`.ivf` - IVF (k-means lists) approximate search on the device.
* :mod:`.faiss_io` - a faiss-cpu backed index, faiss files and lc FAISS folders.
* :mod:`.filters` - metadata filters compiled to a device mask.
* :mod:`.mmr` - maximal marginal relevance on the device.
* :mod:`.persistence` / :mod:`.store_io` - the pickle-free save format.
* :mod:`.distance` / :mod:`.docstore` - distance strategies; documents and row ids.

Importing this package imports no torch; the modules that need it import it lazily or are
imported only on use.
"""
