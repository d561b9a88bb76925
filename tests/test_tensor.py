"""Foundation: dtypes (bf16 rounding), creation, numpy and DLPack interop, repr, memory stats
and limits from Python, and bad inputs."""
import numpy as np
import pytest
import torch

import xtrain


# ------------------------------------------------------------------ dtypes and conversions
def test_bf16_rounds_to_nearest_even_like_torch():
    rng = np.random.default_rng(0)
    vals = np.concatenate([
        rng.standard_normal(10000).astype(np.float32) * 10.0 ** rng.integers(-30, 30, 10000),
        np.array([1.00390625, 1.01171875, -1.00390625, 65504.0, 3.0e38, 1e-40, -0.0, 0.0, np.inf, -np.inf],
                 dtype=np.float32),
    ]).astype(np.float32)
    ours = xtrain.tensor(vals, dtype="bfloat16").numpy()
    ref = torch.from_numpy(vals).to(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(ours.view(np.uint32), ref.view(np.uint32))


def test_bf16_keeps_nan():
    out = xtrain.tensor([np.nan, 1.0], dtype="bfloat16").numpy()
    assert np.isnan(out[0]) and out[1] == 1.0


@pytest.mark.parametrize("src,dst", [("float32", "bfloat16"), ("bfloat16", "float32"), ("float32", "float64"),
                                     ("float64", "float32"), ("int64", "float32"), ("float32", "int32"),
                                     ("int32", "int64")])
def test_to_dtype_matches_numpy_then_torch(src, dst):
    vals = np.array([[-3.0, -1.5, 0.0], [2.25, 7.0, 1000.0]])
    x = xtrain.tensor(vals, dtype=src)
    y = x.to(dtype=dst)
    assert y.dtype == dst and y.shape == (2, 3)
    tmap = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64,
            "int32": torch.int32, "int64": torch.int64}
    ref = torch.tensor(vals).to(tmap[src]).to(tmap[dst]).double().numpy()
    np.testing.assert_array_equal(y.numpy().astype(np.float64), ref)


# ------------------------------------------------------------------ creation
def test_tensor_from_nested_lists_and_numpy():
    a = xtrain.tensor([[1, 2, 3], [4, 5, 6]])
    assert a.dtype == "int64" and a.shape == (2, 3)
    b = xtrain.tensor([[1.5, 2.0]])
    assert b.dtype == "float32"
    c = xtrain.tensor(np.arange(6, dtype=np.float64).reshape(2, 3))
    assert c.dtype == "float64"
    np.testing.assert_array_equal(c.numpy(), np.arange(6).reshape(2, 3))
    d = xtrain.tensor(3.5)
    assert d.shape == () and d.item() == 3.5
    e = xtrain.tensor(np.array([1, 2], dtype=np.int32))
    assert e.dtype == "int32"


def test_creation_functions():
    z = xtrain.zeros(2, 3)
    assert z.shape == (2, 3) and z.dtype == "float32" and not z.numpy().any()
    o = xtrain.ones((4,), dtype="bfloat16")
    assert o.dtype == "bfloat16" and (o.numpy() == 1).all()
    f = xtrain.full((2, 2), 7.5, dtype="float64")
    assert (f.numpy() == 7.5).all()
    e = xtrain.empty(3, 4)
    assert e.shape == (3, 4)
    r = xtrain.arange(5)
    assert r.dtype == "int64" and r.numpy().tolist() == [0, 1, 2, 3, 4]
    r2 = xtrain.arange(0.0, 1.0, 0.25)
    np.testing.assert_allclose(r2.numpy(), [0, 0.25, 0.5, 0.75])


def test_random_is_seeded_and_reproducible():
    g1, g2 = xtrain.Generator(123), xtrain.Generator(123)
    a = xtrain.randn(1000, generator=g1).numpy()
    b = xtrain.randn(1000, generator=g2).numpy()
    np.testing.assert_array_equal(a, b)
    c = xtrain.randn(1000, generator=g1).numpy()  # the generator advanced
    assert not np.array_equal(a, c)
    assert abs(a.mean()) < 0.1 and abs(a.std() - 1) < 0.1
    u = xtrain.rand(10000, generator=xtrain.Generator(5)).numpy()
    assert u.min() >= 0 and u.max() < 1 and abs(u.mean() - 0.5) < 0.02
    xtrain.manual_seed(9)
    x = xtrain.rand(8).numpy()
    xtrain.manual_seed(9)
    np.testing.assert_array_equal(x, xtrain.rand(8).numpy())


def test_generator_state_round_trip():
    g = xtrain.Generator(7)
    xtrain.rand(10, generator=g)
    state = g.get_state()
    a = xtrain.rand(5, generator=g).numpy()
    g.set_state(state)
    np.testing.assert_array_equal(a, xtrain.rand(5, generator=g).numpy())


def test_repr_shows_values_like_numpy():
    r = repr(xtrain.tensor([[1.0, 2.5], [3.0, 4.0]]))
    assert "2.5" in r and "float32" in r and r.startswith("tensor(")
    assert "bfloat16" in repr(xtrain.ones(2, dtype="bfloat16"))


def test_views_share_storage():
    x = xtrain.tensor(np.arange(6, dtype=np.float32))
    v = x.reshape(2, 3)
    assert v.same_storage(x)
    arr = x.numpy()  # numpy() of a CPU float32 tensor shares memory, read-only (issue 36)
    assert not arr.flags.writeable
    x.fill_(100.0)
    assert arr[0] == 100.0 and v.numpy()[0, 0] == 100.0


# ------------------------------------------------------------------ DLPack
def test_dlpack_to_torch_shares_memory():
    x = xtrain.zeros(3, 4)
    t = torch.from_dlpack(x)
    assert t.data_ptr() == x.data_ptr()
    t[1, 2] = 5.0
    assert x.numpy()[1, 2] == 5.0


def test_dlpack_from_torch_shares_memory():
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    x = xtrain.from_dlpack(t)
    assert x.data_ptr() == t.data_ptr() and x.shape == (3, 4) and x.dtype == "float32"
    t[0, 0] = -7.0
    assert x.numpy()[0, 0] == -7.0
    del t  # xtrain keeps the producer's memory alive
    assert x.numpy()[2, 3] == 11.0


def test_dlpack_bf16_and_int_round_trip():
    t = torch.tensor([1.5, -2.0, 3.25], dtype=torch.bfloat16)
    x = xtrain.from_dlpack(t)
    assert x.dtype == "bfloat16"
    np.testing.assert_array_equal(x.numpy(), [1.5, -2.0, 3.25])
    i = xtrain.from_dlpack(torch.tensor([1, 2, 3]))
    assert i.dtype == "int64"
    back = torch.from_dlpack(xtrain.tensor([4, 5], dtype="int32"))
    assert back.dtype == torch.int32 and back.tolist() == [4, 5]


def test_dlpack_with_numpy():
    a = np.arange(5, dtype=np.float32)
    x = xtrain.from_dlpack(a)
    a[0] = 9
    assert x.numpy()[0] == 9
    assert np.from_dlpack(x).tolist()[0] == 9


def test_dlpack_rejects_non_contiguous():
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()
    with pytest.raises(ValueError, match="contiguous"):
        xtrain.from_dlpack(t)


# ------------------------------------------------------------------ memory stats and limits
def test_memory_stats_track_allocations():
    xtrain.empty_cache("cpu")
    s0 = xtrain.memory_stats("cpu")
    x = xtrain.empty(1024, 1024)  # 4 MiB
    s1 = xtrain.memory_stats("cpu")
    assert s1["allocated_bytes.current"] - s0["allocated_bytes.current"] == 4 << 20
    del x
    s2 = xtrain.memory_stats("cpu")
    assert s2["allocated_bytes.current"] == s0["allocated_bytes.current"]
    assert s2["reserved_bytes.current"] >= s0["reserved_bytes.current"] + (4 << 20)  # cached
    y = xtrain.empty(1024, 1024)  # reuses the cached block
    s3 = xtrain.memory_stats("cpu")
    assert s3["num_cache_hits"] == s2["num_cache_hits"] + 1
    assert s3["num_raw_alloc"] == s2["num_raw_alloc"]
    del y
    xtrain.reset_peak_memory_stats("cpu")
    s4 = xtrain.memory_stats("cpu")
    assert s4["allocated_bytes.peak"] == s4["allocated_bytes.current"]


def test_memory_history_and_segments_show_a_miss_beside_free_pieces():
    # Sizes no earlier test leaves cached (empty_cache keeps only pieces of partly used allocations),
    # never written (empty): 201, 67 and 268 MiB of address space.
    mib = 1 << 20
    xtrain.empty_cache("cpu")
    xtrain.record_memory_history(True, "cpu")
    try:
        a = xtrain.empty(201 * mib // 4)
        b = xtrain.empty(67 * mib // 4)
        del a
        c = xtrain.empty(268 * mib // 4)  # the freed 201 MiB cannot serve it
        events = xtrain.memory_history("cpu")
        assert [e["requested"] for e in events] == [201 * mib, 67 * mib, 268 * mib]
        last = events[-1]
        assert last["pool"] == 0 and last["owner_free_bytes"] >= 201 * mib
        assert last["owner_largest_free"] >= 201 * mib and last["allocated_bytes"] >= 67 * mib
        segments = xtrain.memory_segments("cpu")
        assert sum(s["size"] for s in segments) >= 536 * mib
        for s in segments:
            assert sum(p["size"] for p in s["pieces"]) == s["size"]
            assert [p["offset"] for p in s["pieces"]] == sorted(p["offset"] for p in s["pieces"])
        assert any(p["free"] and p["size"] >= 201 * mib for s in segments for p in s["pieces"])
        del b, c
        xtrain.empty_cache("cpu")
    finally:
        xtrain.record_memory_history(False, "cpu")
    with pytest.raises(ValueError, match="unknown device"):
        xtrain.memory_history("tpu")


def test_memory_limit_raises_then_recovers():
    base = xtrain.memory_stats("cpu")["reserved_bytes.current"]
    xtrain.empty_cache("cpu")
    base = xtrain.memory_stats("cpu")["reserved_bytes.current"]
    xtrain.set_memory_limit(base + (8 << 20), "cpu")
    try:
        keep = xtrain.empty(1024, 1024)  # 4 MiB fits
        with pytest.raises(xtrain.OutOfMemoryError) as info:
            xtrain.empty(2048, 1024)  # 8 MiB more does not
        msg = str(info.value)
        assert "tried to allocate 8.00 MiB" in msg and "allocated" in msg and "reserved" in msg and "limit" in msg
        assert isinstance(info.value, MemoryError) and isinstance(info.value, RuntimeError)
        s = xtrain.memory_stats("cpu")
        assert s["num_ooms"] >= 1 and s["limit_bytes"] == base + (8 << 20)
        more = xtrain.ones(512, 1024)  # the process keeps working under the limit
        assert more.numpy().sum() == 512 * 1024
        del keep, more
    finally:
        xtrain.set_memory_limit(None, "cpu")
    assert xtrain.memory_stats("cpu")["limit_bytes"] is None
    big = xtrain.empty(4096, 1024)
    assert big.shape == (4096, 1024)


# ------------------------------------------------------------------ bad inputs
@pytest.mark.parametrize("dtype", ["float16", "complex64", "f8", ""])
def test_unknown_dtype_raises(dtype):
    with pytest.raises(ValueError, match="unknown dtype"):
        xtrain.zeros(2, dtype=dtype)


@pytest.mark.parametrize("dev", ["tpu", "cuda:x", "cuda:-1", "CPU", "cuda:"])
def test_unknown_device_raises(dev):
    with pytest.raises(ValueError, match="unknown device"):
        xtrain.zeros(2, device=dev)


def test_ragged_list_raises():
    with pytest.raises(ValueError, match="ragged"):
        xtrain.tensor([[1, 2], [3]])


def test_wrong_typed_arguments_raise():
    with pytest.raises(TypeError):
        xtrain.zeros("a", 2)
    with pytest.raises(TypeError):
        xtrain.zeros(2, dtype=3)
    with pytest.raises(TypeError):
        xtrain.tensor(["a", "b"])
    with pytest.raises(ValueError):
        xtrain.zeros(-1)
    with pytest.raises(TypeError):
        xtrain.set_memory_limit("lots", "cpu")
    with pytest.raises(ValueError):
        xtrain.ones(2).item()


def test_sizes_that_overflow_raise_instead_of_allocating_too_little():
    with pytest.raises(ValueError, match="more elements than fit"):
        xtrain.zeros(2**40, 2**40)
    with pytest.raises(ValueError, match="more bytes than fit"):
        xtrain.zeros(2**62)
    with pytest.raises(xtrain.OutOfMemoryError):
        xtrain.arange(0, 10**18)
    assert xtrain.ones(3).numpy().sum() == 3  # and the process goes on


def test_from_dlpack_rejects_other_objects():
    with pytest.raises(TypeError, match="__dlpack__"):
        xtrain.from_dlpack(object())


def test_cuda_device_without_gpu_is_a_clear_error():
    if xtrain.cuda.is_available():
        pytest.skip("a GPU is present: this checks the message on machines without one")
    with pytest.raises(RuntimeError, match="CUDA"):
        xtrain.zeros(2, device="cuda:0")


def test_cuda_queries_work_everywhere():
    assert isinstance(xtrain.cuda.is_built(), bool)
    assert xtrain.cuda.device_count() >= 0
    assert isinstance(xtrain.cuda.runtime_info(), str)
