"""Vector search behind :class:`~langchain_ascend.vectorstores.AscendFAISS`.

The indexes: :mod:`.device_index` (exact, flat), :mod:`.ivf` (k-means lists, approximate),
:mod:`.faiss_io` (a faiss-cpu index; faiss files and lc FAISS folders), with :mod:`.filters`
(metadata filters as a device mask), :mod:`.mmr` and :mod:`.distance`.

The store built on them: :mod:`.store_state` (index + documents + row ids under one lock),
:mod:`.search` (rows, scores, thresholds, MMR over that state), :mod:`.async_search` (the
async twins), :mod:`.retriever` (batched retrieval), :mod:`.embedding_calls`,
:mod:`.docstore` (read-only views), :mod:`.persistence` / :mod:`.store_io` (the pickle-free
save format, adoption and merge of lc FAISS stores) and :mod:`.checks` (argument checks).

Importing this package imports no torch; the modules that need it import it lazily.
"""
