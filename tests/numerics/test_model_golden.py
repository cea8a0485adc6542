"""langrt's logits equal HF transformers' on the same weights (fp32): prefill of a ragged batch,
step-by-step decode, an extend on top of a prefix another request wrote into the pool, and a
pass mixing one-token, few-token and whole-prompt extends."""

from __future__ import annotations

import pytest
import torch

from runner_driver import RunnerDriver, make_runner

LENGTHS = (7, 19, 33)
DECODE_STEPS = 16


def _prompts(seed: int, lengths=LENGTHS) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    # Ordinary tokens only (ids below 17 are SmolLM2's control tokens).
    return [torch.randint(17, 49152, (n,), generator=gen).tolist() for n in lengths]


def _hf_logits(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].float()


def _check_prefill(hf, driver, tol):
    prompts = _prompts(0)
    ours = driver.prefill(prompts)
    for prompt, logits in zip(prompts, ours):
        assert (logits - _hf_logits(hf, prompt)).abs().max().item() <= tol


def _check_decode(hf, driver, tol):
    prompts = _prompts(1)
    last = [x[-1] for x in driver.prefill(prompts)]
    indices = list(range(len(driver.seqs) - len(prompts), len(driver.seqs)))
    worst = 0.0
    for _ in range(DECODE_STEPS):
        tokens = [int(x.argmax()) for x in last]
        logits = driver.decode(indices, tokens)
        for k, i in enumerate(indices):
            worst = max(worst, (logits[k] - _hf_logits(hf, driver.seqs[i])[-1]).abs().max().item())
        last = list(logits)
    assert worst <= tol


def _check_extend_on_prefix(hf, driver, tol):
    prefix, suffix, other = _prompts(2, (20, 13, 9))
    (first,) = driver.prefill([prefix])
    j = len(driver.seqs) - 1
    extended, fresh = driver.prefill([prefix + suffix, other], prefix_from=[(j, len(prefix)), None])
    assert extended.shape[0] == len(suffix), "only the suffix is computed"
    reference = _hf_logits(hf, prefix + suffix)
    assert (extended - reference[len(prefix) :]).abs().max().item() <= tol
    assert (fresh - _hf_logits(hf, other)).abs().max().item() <= tol


def _check_mixed_pass(hf, driver, tol):
    """One pass with one new token on a prefix, a few (jump-forward drafts), a few more on
    another, and a whole 40-token prompt: short extends share one padded attention, the long
    one runs alone."""
    a, b, c, fresh = _prompts(4, (11, 30, 6, 40))
    driver.prefill([a, b, c])
    base = len(driver.seqs) - 3
    extra = _prompts(5, (1, 5, 16))
    prompts = [a + extra[0], b + extra[1], c + extra[2], fresh]
    reuse = [(base, len(a)), (base + 1, len(b)), (base + 2, len(c)), None]
    for prompt, logits, start in zip(prompts, driver.prefill(prompts, prefix_from=reuse), (len(a), len(b), len(c), 0)):
        assert logits.shape[0] == len(prompt) - start
        assert (logits - _hf_logits(hf, prompt)[start:]).abs().max().item() <= tol


def _check_mixed_pass_interleaved(hf, driver, tol):
    """One-token extends on either side of a few-token one: attention takes the one-token
    extends as a block of their own, gathering their rows from around the other."""
    a, b, c = _prompts(6, (9, 21, 14))
    driver.prefill([a, b, c])
    base = len(driver.seqs) - 3
    extra = _prompts(7, (1, 6, 1))
    prompts = [a + extra[0], b + extra[1], c + extra[2]]
    reuse = [(base, len(a)), (base + 1, len(b)), (base + 2, len(c))]
    for prompt, logits, start in zip(prompts, driver.prefill(prompts, prefix_from=reuse), (len(a), len(b), len(c))):
        assert logits.shape[0] == len(prompt) - start
        assert (logits - _hf_logits(hf, prompt)[start:]).abs().max().item() <= tol


CHECKS = [_check_prefill, _check_decode, _check_extend_on_prefix, _check_mixed_pass, _check_mixed_pass_interleaved]


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def tiny_pair(request, tiny_llama_dir, tiny_qwen2_dir):
    from transformers import AutoModelForCausalLM

    path = {"llama": tiny_llama_dir, "qwen2": tiny_qwen2_dir}[request.param]
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return hf, make_runner(path, max_total_tokens=4096, max_running_requests=32)


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__.removeprefix("_check_"))
def test_tiny_models_match_hf(tiny_pair, check):
    hf, runner = tiny_pair
    check(hf, RunnerDriver(runner), tol=1e-4)


@pytest.fixture(scope="module")
def smollm_pair(smollm_path):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(smollm_path.parent, gguf_file=smollm_path.name, dtype=torch.float32)
    # HF dequantizes the file: compare with langrt's dequantized model (its kernels on the stored
    # blocks are held to that model in test_quant_linear.py).
    runner = make_runner(smollm_path, max_total_tokens=4096, max_running_requests=32, quantization="none")
    return hf.eval(), runner


@pytest.mark.slow
@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__.removeprefix("_check_"))
def test_smollm_gguf_matches_hf(smollm_pair, check):
    hf, runner = smollm_pair
    check(hf, RunnerDriver(runner), tol=1e-3)


@pytest.mark.slow
def test_torch_compile_gives_the_same_logits(tiny_llama_dir):
    """--enable-torch-compile runs the same math (compiled dense halves of each layer)."""
    eager = RunnerDriver(make_runner(tiny_llama_dir, max_total_tokens=2048, max_running_requests=8))
    compiled = RunnerDriver(
        make_runner(tiny_llama_dir, max_total_tokens=2048, max_running_requests=8, enable_torch_compile=True)
    )
    prompts = _prompts(3)
    for a, b in zip(eager.prefill(prompts), compiled.prefill(prompts)):
        assert (a - b).abs().max().item() <= 1e-4
    tokens = [int(x[-1].argmax()) for x in eager.prefill(prompts)]
    compiled.prefill(prompts)
    for _ in range(3):
        a = eager.decode([3, 4, 5], tokens)
        b = compiled.decode([3, 4, 5], tokens)
        assert (a - b).abs().max().item() <= 1e-4
        tokens = [int(t) for t in a.argmax(-1)]


@pytest.mark.parametrize("rows", [1, 2, 16, 64, 65, 300])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_equals_torch_linear(rows, dtype):
    """layers.linear picks a CPU kernel by row count and dtype; the math is x @ W.T + b."""
    from langrt.model.layers import linear

    gen = torch.Generator().manual_seed(rows)
    x, w, b = (torch.randn(shape, generator=gen).to(dtype) for shape in ((rows, 96), (40, 96), (40,)))
    expected = torch.nn.functional.linear(x.float(), w.float(), b.float())
    for bias in (None, b):
        got = linear(x, w, bias).float()
        assert got.shape == (rows, 40)
        want = expected if bias is not None else expected - b.float()
        if dtype == torch.float32:
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
        else:  # two bf16 roundings (product, then + bias): within 2 ulps of each value
            torch.testing.assert_close(got, want, rtol=2**-6, atol=2**-6)


@pytest.mark.parametrize("rows", [1, 2, 7, 16, 40, 65, 256, 300])
@pytest.mark.parametrize("shape", [(960, 576), (576, 576), (3072, 576), (576, 1536)])
def test_packed_bf16_linear_gives_torch_linears_bits(rows, shape):
    """A packed copy (bf16 on CPU) changes the speed, not the numbers: every product is the
    bits torch's own bf16 linear gives (a single row: the GEMV on the plain weight, as before)."""
    from langrt.model.layers import can_pack, linear, pack_weight

    gen = torch.Generator().manual_seed(rows)
    x, w, b = (torch.randn(s, generator=gen).to(torch.bfloat16) for s in ((rows, shape[1]), shape, shape[:1]))
    if not can_pack(w):
        pytest.skip(
            "AVX-512-only path: oneDNN's packed bf16 GEMM needs AVX-512BW (or AVX-NE-CONVERT), which this CPU lacks"
        )
    packed = pack_weight(w)
    for bias in (None, b):
        plain = linear(x, w, bias)
        assert torch.equal(linear(x, w, bias, packed), plain)
        if rows > 1:
            assert torch.equal(plain, torch.nn.functional.linear(x, w, bias))
