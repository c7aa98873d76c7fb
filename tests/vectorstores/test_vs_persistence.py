"""save_local / load_local: round trips, atomicity, damage detection, lc FAISS folders."""

from __future__ import annotations

import datetime as dt
import json
import os
import pickle
import threading
from pathlib import Path

import numpy as np
import pytest
from vectorstore_test_helpers import TableEmbeddings, lc_module

from langchain_ascend import AscendFAISS
from langchain_ascend.errors import (
    ChecksumMismatchError,
    IndexFormatError,
    UnsafeDeserializationError,
    VectorStoreInputError,
)
from langchain_ascend.index.persist import folder as persistence
from langchain_ascend.index.persist.folder_lock import LOCK_FILE

FAISS = lc_module("langchain_community.vectorstores").FAISS
TEXTS = [f"doc {i}" for i in range(60)]
QUERIES = ["q1", "q2", "q3"]


@pytest.fixture
def emb() -> TableEmbeddings:
    return TableEmbeddings(dim=16, seed=5)


def results(store: AscendFAISS, **kwargs) -> list:
    return [[(d.id, d.page_content, d.metadata, round(s, 5))
             for d, s in store.similarity_search_with_score(q, k=4, **kwargs)] for q in QUERIES]


@pytest.mark.parametrize("options", [
    {},
    {"distance_strategy": "COSINE", "dtype": "float16"},
    {"index_type": "ivf", "nlist": 4, "nprobe": 2, "ivf_min_train_size": 10},
    {"index_type": "faiss", "faiss_factory": "IVF4,Flat", "nprobe": 2},
    {"distance_strategy": "MAX_INNER_PRODUCT", "normalize_L2": True},
])
@pytest.mark.filterwarnings("ignore:Normalizing L2 is not applicable")
def test_round_trip_gives_identical_results(tmp_path, emb, options) -> None:
    metas = [{"i": i, "when": dt.date(2024, 1, 1 + i % 28), "pair": (i, "x"), "raw": b"\x00\x01",
              "nested": {"tags": {"a", "b"}, 3: "int key"}} for i in range(60)]
    store = AscendFAISS.from_texts(TEXTS, emb, metadatas=metas, device="cpu", **options)
    store.delete([store.index_to_docstore_id[7]])
    before = results(store)
    if options.get("index_type") == "ivf":
        assert store.index.is_trained
    store.save_local(tmp_path)
    loaded = AscendFAISS.load_local(tmp_path, emb)
    assert results(loaded) == before
    assert results(loaded, filter={"when": {"$gte": dt.date(2024, 1, 20)}}) == results(
        store, filter={"when": {"$gte": dt.date(2024, 1, 20)}})
    assert loaded.get_by_ids([before[0][0][0]])[0].metadata["nested"] == {
        "tags": {"a", "b"}, 3: "int key"}
    assert not list(tmp_path.glob("*.pkl"))


def test_saving_again_replaces_atomically_and_cleans_up(tmp_path, emb) -> None:
    store = AscendFAISS.from_texts(TEXTS[:10], emb, device="cpu")
    store.save_local(tmp_path, index_name="a")
    store.save_local(tmp_path, index_name="b")  # two indexes share a folder
    store.add_texts(["late"])
    store.save_local(tmp_path, index_name="a")
    assert len(AscendFAISS.load_local(tmp_path, emb, index_name="a")) == 11
    assert len(AscendFAISS.load_local(tmp_path, emb, index_name="b")) == 10
    names = sorted(p.name for p in tmp_path.iterdir())
    assert len([n for n in names if n.startswith("a.ascend-")]) == 1
    assert [n for n in names if n.startswith(".")] == [LOCK_FILE]  # saves take turns on it


@pytest.mark.parametrize("crash_point", ["write", "rename", "pointer"])
def test_crash_mid_save_leaves_old_copy_loadable(tmp_path, emb, monkeypatch, crash_point) -> None:
    store = AscendFAISS.from_texts(TEXTS[:10], emb, device="cpu")
    store.save_local(tmp_path)
    store.add_texts(["unsaved"])

    def boom(*args, **kwargs):
        raise OSError("disk full")

    target = {"write": "_write_durably", "rename": "rename", "pointer": "replace"}[crash_point]
    if crash_point == "write":
        monkeypatch.setattr(persistence, target, boom)
    else:
        monkeypatch.setattr(persistence.os, target, boom)
    with pytest.raises(OSError, match="disk full"):
        store.save_local(tmp_path)
    monkeypatch.undo()
    assert len(AscendFAISS.load_local(tmp_path, emb)) == 10


def current_generation(folder: Path) -> Path:
    pointer = json.loads((folder / "index.ascend.json").read_text())
    return folder / pointer["generation"]


@pytest.fixture
def saved(tmp_path, emb) -> Path:
    AscendFAISS.from_texts(TEXTS, emb, device="cpu").save_local(tmp_path)
    return tmp_path


def test_flipped_byte_is_a_checksum_mismatch(saved, emb) -> None:
    vectors = current_generation(saved) / "vectors.safetensors"
    data = bytearray(vectors.read_bytes())
    data[-5] ^= 0xFF
    vectors.write_bytes(bytes(data))
    with pytest.raises(ChecksumMismatchError, match="vectors.safetensors"):
        AscendFAISS.load_local(saved, emb)


def test_truncated_file_is_reported(saved, emb) -> None:
    docs = current_generation(saved) / "docstore.json"
    docs.write_bytes(docs.read_bytes()[:100])
    with pytest.raises(IndexFormatError, match="truncated"):
        AscendFAISS.load_local(saved, emb)


@pytest.mark.parametrize("damage", ["manifest", "pointer-json", "newer-version", "no-folder",
                                    "missing-file"])
def test_damaged_folders_raise_index_format_error(saved, emb, damage) -> None:
    gen = current_generation(saved)
    pointer = saved / "index.ascend.json"
    if damage == "manifest":
        (gen / "manifest.json").write_text("{}")
    elif damage == "pointer-json":
        pointer.write_text('{"format": "langchain-ascend-faiss", "format_ver')
    elif damage == "newer-version":
        doc = json.loads(pointer.read_text())
        doc["format_version"] = persistence.FORMAT_VERSION + 1
        pointer.write_text(json.dumps(doc))
    elif damage == "no-folder":
        for path in gen.iterdir():
            path.unlink()
        gen.rmdir()
    else:
        (gen / "docstore.json").unlink()
    with pytest.raises(IndexFormatError) as info:
        AscendFAISS.load_local(saved, emb)
    if damage == "newer-version":
        assert "upgrade" in str(info.value)


def test_missing_index_name_is_reported(tmp_path, emb) -> None:
    with pytest.raises(IndexFormatError, match="no saved index named 'other'"):
        AscendFAISS.load_local(tmp_path, emb, index_name="other")


def test_unsaveable_metadata_fails_before_writing(tmp_path, emb) -> None:
    store = AscendFAISS.from_texts(["a"], emb, metadatas=[{"obj": object()}], device="cpu")
    with pytest.raises(VectorStoreInputError, match="obj"):
        store.save_local(tmp_path)
    assert list(tmp_path.iterdir()) == []
    arrays = AscendFAISS.from_texts(["a"], emb, metadatas=[{"emb": np.array([1, 2])}],
                                    ids=["doc-7"], device="cpu")
    with pytest.raises(VectorStoreInputError, match=r"'doc-7'\['emb'\] of type ndarray.*tolist"):
        arrays.save_local(tmp_path)
    assert list(tmp_path.iterdir()) == []
    scalars = AscendFAISS.from_texts(["a"], emb, metadatas=[{"n": np.int64(3), "z": np.array(
        1.5)}], device="cpu")  # numpy scalars (and 0-d arrays) are their numbers
    scalars.save_local(tmp_path)
    assert AscendFAISS.load_local(tmp_path, emb).similarity_search("a")[0].metadata == {
        "n": 3, "z": 1.5}


@pytest.mark.parametrize("strategy", ["EUCLIDEAN_DISTANCE", "MAX_INNER_PRODUCT"])
def test_lc_faiss_folder_needs_the_flag_and_imports_exactly(tmp_path, emb, strategy) -> None:
    strategies = lc_module("langchain_community.vectorstores.utils").DistanceStrategy
    metas = [{"i": i} for i in range(60)]
    lc = FAISS.from_texts(TEXTS, emb, metadatas=metas, distance_strategy=strategies[strategy])
    lc.delete([lc.index_to_docstore_id[3]])
    lc.save_local(str(tmp_path))
    with pytest.raises(UnsafeDeserializationError, match="allow_dangerous_deserialization"):
        AscendFAISS.load_local(tmp_path, emb)
    assert issubclass(UnsafeDeserializationError, ValueError)  # lc raises ValueError too
    ours = AscendFAISS.load_local(tmp_path, emb, allow_dangerous_deserialization=True,
                                  device="cpu")  # strategy inferred from the faiss metric
    assert ours.distance_strategy.value == strategy
    for q in QUERIES:
        want = lc.similarity_search_with_score(q, k=5)
        got = ours.similarity_search_with_score(q, k=5)
        assert [d.id for d, _ in got] == [d.id for d, _ in want]
        np.testing.assert_allclose([s for _, s in got], [float(s) for _, s in want], atol=1e-4)
        assert [d.metadata for d, _ in got] == [d.metadata for d, _ in want]
    ours.save_local(tmp_path / "converted")  # re-save without pickle
    assert len(AscendFAISS.load_local(tmp_path / "converted", emb)) == 59


def _lc_store(emb, factory: str, strategy: str):
    """An lc FAISS store over a faiss index of ``factory`` (trained where it needs it)."""
    import faiss

    strategies = lc_module("langchain_community.vectorstores.utils").DistanceStrategy
    docstore = lc_module("langchain_community.docstore.in_memory").InMemoryDocstore
    metric = faiss.METRIC_INNER_PRODUCT if strategy == "MAX_INNER_PRODUCT" else faiss.METRIC_L2
    index = faiss.index_factory(16, factory, metric)
    vectors = np.asarray(emb.embed_documents(TEXTS), dtype=np.float32)
    index.train(vectors)
    lc = FAISS(emb, index, docstore(), {}, distance_strategy=strategies[strategy])
    lc.add_texts(TEXTS, ids=[f"id{i}" for i in range(len(TEXTS))])
    return lc


@pytest.mark.parametrize("factory", ["HNSW16", "IVF4,Flat"])
@pytest.mark.parametrize("path", ["folder", "bytes", "constructor"])
def test_a_non_flat_lc_index_searches_after_its_source_is_gone(tmp_path, emb, factory,
                                                                path) -> None:
    """A non-flat faiss index taken over from lc (a folder, lc's pickle bytes, the
    constructor) stays alive in the store: its concrete proxy did not own the C++ index,
    which went with the caller's last reference (searches asserted, found nothing or
    crashed); lc's bytes also give the strategy of the index's metric, as a folder does."""
    import gc

    import faiss

    strategy = "MAX_INNER_PRODUCT" if path == "bytes" else "EUCLIDEAN_DISTANCE"
    lc = _lc_store(emb, factory, strategy)
    want = [[(d.id, round(float(s), 4)) for d, s in lc.similarity_search_with_score(q, k=4)]
            for q in QUERIES]
    if path == "folder":
        lc.save_local(str(tmp_path))
        ours = AscendFAISS.load_local(tmp_path, emb, allow_dangerous_deserialization=True,
                                      device="cpu")
    elif path == "bytes":
        ours = AscendFAISS.deserialize_from_bytes(lc.serialize_to_bytes(), emb,
                                                  allow_dangerous_deserialization=True,
                                                  device="cpu")
        assert ours.distance_strategy.value == "MAX_INNER_PRODUCT"
    else:
        faiss.write_index(lc.index, str(tmp_path / "index.faiss"))
        ours = AscendFAISS(emb, index=faiss.read_index(str(tmp_path / "index.faiss")),
                           docstore=lc.docstore, index_to_docstore_id=lc.index_to_docstore_id,
                           device="cpu")
    del lc
    gc.collect()
    got = [[(d.id, round(float(s), 4)) for d, s in ours.similarity_search_with_score(q, k=4)]
           for q in QUERIES]
    assert got == want


def test_serialize_to_bytes_round_trip_and_pickle_guard(emb) -> None:
    store = AscendFAISS.from_texts(TEXTS[:5], emb, device="cpu")
    blob = store.serialize_to_bytes()
    assert results(AscendFAISS.deserialize_from_bytes(blob, emb)) == results(store)
    lc_blob = FAISS.from_texts(TEXTS[:5], emb).serialize_to_bytes()
    with pytest.raises(UnsafeDeserializationError):
        AscendFAISS.deserialize_from_bytes(lc_blob, emb)
    loaded = AscendFAISS.deserialize_from_bytes(lc_blob, emb, allow_dangerous_deserialization=True)
    assert len(loaded) == 5
    with pytest.raises(IndexFormatError):
        AscendFAISS.deserialize_from_bytes(b"not a store", emb)
    with pytest.raises(IndexFormatError, match="serialize_to_bytes"):  # a pickle, not lc's
        AscendFAISS.deserialize_from_bytes(pickle.dumps([1, 2]), emb,
                                           allow_dangerous_deserialization=True)


def test_saved_files_have_no_pickle(saved) -> None:
    gen = current_generation(saved)
    assert sorted(p.name for p in gen.iterdir()) == ["docstore.json", "manifest.json",
                                                    "vectors.safetensors"]
    manifest = json.loads((gen / "manifest.json").read_text())
    assert manifest["format_version"] == persistence.FORMAT_VERSION
    assert set(manifest["files"]) == {"docstore.json", "vectors.safetensors"}
    assert all(len(v["sha256"]) == 64 for v in manifest["files"].values())
    assert os.path.getsize(gen / "vectors.safetensors") == manifest["files"][
        "vectors.safetensors"]["bytes"]


def test_load_removes_what_a_killed_save_left_but_not_a_live_save(tmp_path, emb) -> None:
    store = AscendFAISS.from_texts(TEXTS, emb, device="cpu")
    store.save_local(tmp_path)
    # A save killed mid-way leaves its hidden staging folder and pointer file behind.
    dead = tmp_path / ".index.ascend-deadbeefdeadbeef.tmp"
    dead.mkdir()
    (dead / "vectors.safetensors").write_bytes(b"\0" * 4096)
    dead_pointer = tmp_path / ".index.ascend.json.index.ascend-deadbeefdeadbeef.tmp"
    dead_pointer.write_text("{}")
    old = dt.datetime.now().timestamp() - 3600
    for path in (dead, dead_pointer):
        os.utime(path, (old, old))
    # A save running right now in another process owns a fresh one.
    live = tmp_path / ".index.ascend-0123456789abcdef.tmp"
    live.mkdir()
    other_index = tmp_path / ".other.ascend-deadbeefdeadbeef.tmp"
    other_index.mkdir()
    os.utime(other_index, (old, old))

    loaded = AscendFAISS.load_local(tmp_path, emb)
    assert results(loaded) == results(store)
    assert not dead.exists() and not dead_pointer.exists()
    assert live.exists()  # too young to be abandoned
    assert other_index.exists()  # another index's files are not ours to remove
    store.save_local(tmp_path)  # nor does a save's cleanup remove a live save's staging
    assert live.exists() and other_index.exists()
    assert len(AscendFAISS.load_local(tmp_path, emb)) == len(store)


def test_concurrent_saves_and_loads_of_one_folder(tmp_path, emb) -> None:
    """Saves into one folder (two spellings of it) take turns; each cleans up only what is
    stale, never a generation or staging folder another save is writing; a load running
    meanwhile reads a complete save."""
    store = AscendFAISS.from_texts(TEXTS * 20, emb, device="cpu")
    folder = tmp_path / "store"
    folder.mkdir()
    (tmp_path / "link").symlink_to(folder)
    errors: list[BaseException] = []
    saving = threading.Event()
    saving.set()

    def save(path: Path) -> None:
        try:
            for _ in range(8):
                store.save_local(path)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    def load() -> None:
        try:
            while saving.is_set():
                if persistence.has_saved_index(folder, "index"):
                    assert len(AscendFAISS.load_local(folder, emb)) == len(store)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    savers = [threading.Thread(target=save, args=(p,))
              for p in (folder, folder, str(tmp_path / "link"))]
    loader = threading.Thread(target=load)
    for thread in [*savers, loader]:
        thread.start()
    for thread in savers:
        thread.join()
    saving.clear()
    loader.join()
    assert errors == []
    assert len(AscendFAISS.load_local(folder, emb)) == len(store)
    names = [p.name for p in folder.iterdir()]
    assert len([n for n in names if n.startswith("index.ascend-")]) == 1
    assert not [n for n in names if n.endswith(".tmp")]


def test_a_load_whose_generation_a_save_deletes_reads_the_new_one(tmp_path, emb,
                                                                 monkeypatch) -> None:
    store = AscendFAISS.from_texts(TEXTS[:10], emb, device="cpu")
    store.save_local(tmp_path)
    store.add_texts(["late"])
    read = persistence._verified_bytes
    saves = []

    def save_while_reading(path: Path, info: dict) -> bytes:
        if not saves:  # a save replaces the pointer and deletes the generation being read
            saves.append(store.save_local(tmp_path))
        return read(path, info)

    monkeypatch.setattr(persistence, "_verified_bytes", save_while_reading)
    assert len(AscendFAISS.load_local(tmp_path, emb)) == 11 and saves


def test_a_save_waits_while_another_process_holds_the_folder_lock(tmp_path, emb) -> None:
    fcntl = pytest.importorskip("fcntl")
    store = AscendFAISS.from_texts(TEXTS[:10], emb, device="cpu")
    store.save_local(tmp_path)
    store.add_texts(["late"])
    fd = os.open(tmp_path / LOCK_FILE, os.O_RDWR)  # another open file: as another process
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        saver = threading.Thread(target=store.save_local, args=(tmp_path,))
        saver.start()
        saver.join(0.5)
        assert saver.is_alive()  # waiting for the lock
        assert len(AscendFAISS.load_local(tmp_path, emb)) == 10  # loads need no lock
    finally:
        os.close(fd)
    saver.join(10)
    assert not saver.is_alive() and len(AscendFAISS.load_local(tmp_path, emb)) == 11
