"""`queryserve optimize --task seq2seq` end to end: small T5 and BART folders in, CTranslate2
model folders out, served by a real server and compared with Hugging Face `generate`.

No seq2seq checkpoint ships as a package, so the folders are made here the way a user makes
one: a tokenizer trained on MASSIVE utterances with the `tokenizers` library (Unigram for T5,
byte-level BPE for BART) and a model of the real architecture built from its config, with
weights drawn at a large scale so that each input generates a different, input-dependent text
(at the default scale a random T5 emits only padding). Random weights are fragile: int8 changes
most of their generations, so the gate refuses int8 here, which is the gate working; fp32 must
match `generate` exactly.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from queryserve import cli
from queryserve.optimize import seq2seq
from tests.conftest import ROOT, start_server, stop_server

MASSIVE = ROOT / "data" / "massive-en"
FAST = ("--timing-seconds", "0.05", "--no-progress", "--max-output-length", "12")
QUERIES = ["play some jazz", "wake me up at five am this week", "quiet",
           "what is the weather in paris tomorrow", "olly set an alarm for seven",
           "remind me to call mom", "how much is a flight to boston", "turn the lights off"]


def utterances(split: str, limit: int) -> list[str]:
    with (MASSIVE / f"{split}.jsonl").open(encoding="utf-8") as lines:
        return [json.loads(line)["text"] for _, line in zip(range(limit), lines, strict=False)]


def make_t5(out: Path) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from tokenizers.trainers import UnigramTrainer
    from transformers import T5Config, T5ForConditionalGeneration, T5TokenizerFast

    tokenizer = Tokenizer(models.Unigram())
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    tokenizer.train_from_iterator(utterances("train", 3000), UnigramTrainer(
        vocab_size=1000, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>"))
    tokenizer.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", 1)])
    T5TokenizerFast(tokenizer_object=tokenizer, eos_token="</s>", pad_token="<pad>",
                    unk_token="<unk>", extra_ids=0).save_pretrained(str(out))
    torch.manual_seed(0)
    config = T5Config(vocab_size=tokenizer.get_vocab_size(), d_model=64, d_ff=128, d_kv=32,
                      num_layers=2, num_decoder_layers=2, num_heads=2, pad_token_id=0,
                      eos_token_id=1, decoder_start_token_id=0, initializer_factor=8.0)
    T5ForConditionalGeneration(config).save_pretrained(str(out))
    return out


def make_bart(out: Path) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from tokenizers.trainers import BpeTrainer
    from transformers import BartConfig, BartForConditionalGeneration, BartTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(utterances("train", 3000), BpeTrainer(
        vocab_size=800, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    BartTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>",
                      pad_token="<pad>", unk_token="<unk>",
                      mask_token="<mask>").save_pretrained(str(out))
    torch.manual_seed(0)
    config = BartConfig(vocab_size=tokenizer.get_vocab_size(), d_model=64, encoder_layers=2,
                        decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
                        encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=128,
                        init_std=0.5)
    BartForConditionalGeneration(config).save_pretrained(str(out))
    return out


def hf_generate(folder: Path, texts: list[str], beams: int = 1, max_new: int = 12) -> list[str]:
    """The original, through transformers alone (its own tokenizer, padding and decoding)."""
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForSeq2SeqLM.from_pretrained(str(folder)).eval()
    outputs = []
    with torch.inference_mode():
        for text in texts:
            batch = tokenizer([text], return_tensors="pt")
            generated = model.generate(**batch, do_sample=False, num_beams=beams,
                                       max_new_tokens=max_new, forced_eos_token_id=None)
            outputs.append(tokenizer.decode(generated[0], skip_special_tokens=True).strip())
    return outputs


@pytest.fixture(scope="module")
def t5_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_t5(tmp_path_factory.mktemp("t5") / "tiny-t5")


@pytest.fixture(scope="module")
def parity_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("inputs") / "parity.txt"
    path.write_text("\n".join(utterances("test", 48)) + "\n", encoding="utf-8")
    return path


def optimize(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "queryserve", "optimize", *args],
                          capture_output=True, text=True, timeout=600)


def test_t5_fp32_is_served_with_generates_outputs(tmp_path: Path, t5_dir: Path,
                                                   parity_file: Path) -> None:
    out = tmp_path / "repo" / "spell"
    result = optimize(str(t5_dir), "--task", "seq2seq", "--precision", "fp32", "--out", str(out),
                      "--parity", str(parity_file), *FAST)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and "Loading weights" not in result.stderr
    report = json.loads((out / "prepare.json").read_text())
    assert report["chosen"] == "float32" and not report["forced"]
    assert report["variants"][0]["parity"]["mean"] == 1.0
    assert report["before"]["batch_1_ms"] > 0 and report["after"]["batch_32_per_s"] > 0
    threads = report["timing"]["chosen_intra_threads"]  # timed at 1 thread and at all cores
    assert "1" in report["timing"]["by_intra_threads"]["float32"]
    assert f"intra_threads: {threads}" in (out / "model.yaml").read_text()
    assert (out / "ctranslate2" / "model.bin").is_file() and (out / "tokenizer.json").is_file()
    assert "CTranslate2 float32 (written)" in result.stdout

    # Batch concurrent requests for certain: a 50 ms window gathers them.
    config = (out / "model.yaml").read_text()
    (out / "model.yaml").write_text(config.replace("max_queue_delay_microseconds: 0",
                                                   "max_queue_delay_microseconds: 50000"))
    expected = hf_generate(t5_dir, QUERIES)
    assert len(set(expected)) == len(QUERIES)  # input-dependent generations, not a constant
    server = start_server(out.parent, tmp_path / "server.log")
    try:
        import tritonclient.http as triton

        client = triton.InferenceServerClient(server.host_port)
        tensor = triton.InferInput("text", [len(QUERIES), 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[q.encode()] for q in QUERIES], dtype=object))
        for binary in (True, False):
            answer = client.infer("spell", [tensor], outputs=[
                triton.InferRequestedOutput("generated_text", binary_data=binary)])
            got = [v.decode() if isinstance(v, bytes) else v
                   for v in answer.as_numpy("generated_text").ravel()]
            assert got == expected

        async def one_each() -> list[str]:
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
                responses = await asyncio.gather(*(http.post(
                    "/v2/models/spell/infer", json={"inputs": [
                        {"name": "text", "datatype": "BYTES", "shape": [1, 1], "data": [q]}]})
                    for q in QUERIES))
            return [r.json()["outputs"][0]["data"][0] for r in responses]

        assert asyncio.run(one_each()) == expected
        stats = httpx.get(f"{server.url}/v2/models/spell/stats").json()["model_stats"][0]
        assert max(int(b["batch_size"]) for b in stats["batch_stats"]) > 1
        bad = httpx.post(f"{server.url}/v2/models/spell/infer", json={"inputs": [
            {"name": "text", "datatype": "BYTES", "shape": [1, 1], "data": [" "]}]})
        assert bad.status_code == 400 and "empty" in bad.json()["error"]
    finally:
        stop_server(server)


def test_bart_beam_search_matches_generate(tmp_path: Path, parity_file: Path) -> None:
    folder = make_bart(tmp_path / "tiny-bart")
    out = tmp_path / "repo" / "bart"
    result = optimize(str(folder), "--task", "seq2seq", "--precision", "fp32", "--beam-size",
                      "2", "--out", str(out), "--parity", str(parity_file), *FAST)
    assert result.returncode == 0, result.stderr
    assert json.loads((out / "prepare.json").read_text())["decoding"]["beam_size"] == 2
    assert "beam_size: 2" in (out / "model.yaml").read_text()
    # The user's folder is read, never changed (the converter is given a patched copy).
    assert "normalize_before" not in (folder / "config.json").read_text()


def test_int8_that_changes_generations_is_refused_then_forced(
        tmp_path: Path, t5_dir: Path, parity_file: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "repo" / "spell"
    argv = ["optimize", str(t5_dir), "--task", "seq2seq", "--precision", "int8", "--out",
            str(out), "--parity", str(parity_file), *FAST]
    assert cli.main(argv) == 1
    error = capsys.readouterr().err
    assert "int8: misses by exact match 0." in error and "< 0.99" in error
    assert not (out / "ctranslate2").exists()

    assert cli.main([*argv, "--force"]) == 0
    report = json.loads((out / "prepare.json").read_text())
    assert report["forced"] and report["chosen"] == "int8"
    differences = next(v for v in report["variants"] if v["name"] == "int8")["differences"]
    assert differences and differences[0]["original"] != differences[0]["optimized"]
    assert "written with --force" in capsys.readouterr().out


def test_a_damaged_conversion_fails_the_fp32_gate(tmp_path: Path, t5_dir: Path,
                                                  parity_file: Path,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """The converter's output is damaged (its weights stored as int8 while called float32):
    the gate catches it before any variant is built."""
    convert = seq2seq.convert
    monkeypatch.setattr(seq2seq, "convert",
                        lambda source, out, compute_type: convert(source, out, "int8"))
    out = tmp_path / "repo" / "spell"
    assert cli.main(["optimize", str(t5_dir), "--task", "seq2seq", "--precision", "fp32",
                     "--out", str(out), "--parity", str(parity_file), *FAST]) == 1
    assert "float32 CTranslate2 conversion fails its accuracy gate" in capsys.readouterr().err
    assert not out.exists() or not (out / "ctranslate2").exists()
