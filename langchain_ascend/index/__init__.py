"""Vector search behind :class:`~langchain_ascend.vectorstores.AscendFAISS`.

The indexes: :mod:`.device_index` (exact, flat), :mod:`.ivf` (k-means lists, approximate),
:mod:`.faiss_io` (a faiss-cpu index behind the same row contract), with :mod:`.filters`
(metadata filters as a device mask), :mod:`.mmr` and :mod:`.distance`.

The store built on them: :mod:`.store_state` (index + documents + row ids under one lock,
validated writes), :mod:`.search` (rows, scores, thresholds, MMR over that state),
:mod:`.retriever` (batched retrieval), :mod:`.embedding_calls`, :mod:`.docstore` (read-only
views), :mod:`.persist` (reading and writing stores: the pickle-free folder format, lc FAISS
folders and pickles, bytes) and :mod:`.adoption` (taking over an lc FAISS index and docstore,
the rows of a merge).

Importing this package imports no torch; the modules that need it import it lazily.
"""
