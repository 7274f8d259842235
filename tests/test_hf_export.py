"""``nas export --format hf|llama``: a model directory that transformers loads, generates with and trains, and that
computes this project's model on the same weights.

The model-level tests write directories with ``nas.hf.export.write_model_dir`` from a project ``Transformer`` and
load them with ``AutoModelForCausalLM`` (offline, CPU); the command-line tests (slow) export from a tiny study and
from the checkpoints of ``nas train --out`` runs, and feed the command bad input.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import tempfile
import warnings
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from nas.arch import ArchConfig, FFNShape, uniform
from nas.errors import UsageError
from nas.hf.card import Provenance, model_card
from nas.hf.export import WEIGHTS, write_model_dir
from nas.hf.mapping import hf_state_dict, llama_refusal
from nas.hf.target import MANIFEST
from nas.model.transformer import Transformer

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("HF_MODULES_CACHE", str(Path(tempfile.gettempdir()) / f"prism-nas-hf-modules-{os.getuid()}"))
transformers = pytest.importorskip("transformers")

# a Prism schedule with head sizes 24, 12 and 3 (odd: its first 2 channels rotate), K=3 Hourglass sub-MLPs of 20,
# two of them 21 wide, untied, non-default RoPE base and epsilon
PRISM = ArchConfig(n_layers=3, d_model=48, heads=(2, 4, 16), ffn=FFNShape(3, 20, wider=2), vocab_size=300,
                   tie_embeddings=False, rope_theta=12345.0, norm_eps=1e-6)
BASELINE = uniform(2, 64, 4, 320, FFNShape(1, 176))  # uniform heads, K=1, tied: a LLaMA
LOAD_COMPLAINTS = ("missing", "unexpected", "newly initialized", "not initialized", "not used", "mismatch")


def project_model(arch: ArchConfig, seed: int = 0) -> Transformer:
    """A project model with non-trivial norm gains (a mis-mapped norm would show)."""
    torch.manual_seed(seed)
    model = Transformer(arch).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5)
    return model


@contextmanager
def transformers_log():
    """Everything transformers logs (info and up) and every Python warning, as one list of strings."""
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logger, handler = logging.getLogger("transformers"), Keep(logging.INFO)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield records
        records.extend(str(w.message) for w in caught)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def load(path: Path, remote: bool = True):
    """``AutoModelForCausalLM.from_pretrained`` with its loading report and log; asserts a clean load."""
    with transformers_log() as log:
        model, info = transformers.AutoModelForCausalLM.from_pretrained(
            path, trust_remote_code=remote, output_loading_info=True)
    assert not any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")), info
    complaints = [line for line in log if any(word in line.lower() for word in LOAD_COMPLAINTS)]
    assert complaints == []
    return model.eval()


def relative_error(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return float((ours - theirs).abs().max() / theirs.abs().max())


@pytest.fixture(scope="module")
def prism_dir(tmp_path_factory) -> tuple[Transformer, Path]:
    model = project_model(PRISM)
    out = tmp_path_factory.mktemp("export") / "prism-k3"
    write_model_dir(PRISM, out, "hf", weights=model.state_dict(), context=64)
    return model, out


def test_every_parameter_is_mapped_once_and_the_llama_layout_is_refused_to_a_prism_schedule():
    for arch in (PRISM, BASELINE):
        state = Transformer(arch).state_dict()
        mapped = hf_state_dict(state, arch)
        assert sum(t.numel() for t in mapped.values()) == arch.n_params()["total"]
        assert len({t.data_ptr() for t in mapped.values()}) == len(mapped)  # safetensors stores no shared memory
    assert llama_refusal(BASELINE) is None
    assert "head count differs by layer" in llama_refusal(PRISM)
    assert "K=3" in llama_refusal(PRISM.replace(heads=[4, 4, 4]))
    assert "odd" in llama_refusal(uniform(1, 48, 16, 300))


@pytest.mark.parametrize("arch", [PRISM, BASELINE], ids=["prism-K3-untied", "baseline-tied"])
def test_the_directory_loads_cleanly_and_computes_the_projects_logits(arch, tmp_path):
    model = project_model(arch)
    done = write_model_dir(arch, tmp_path / "m", "hf", weights=model.state_dict(), context=64)
    assert done.files == ("README.md", "config.json", "configuration_prism.py", "model.safetensors",
                          "modeling_prism.py", "nas-export.json")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_prism.PrismForCausalLM"
    assert config["num_attention_heads"] == list(arch.heads) == config["num_key_value_heads"]
    assert (config["ffn_num_mlps"], config["intermediate_size"], config["ffn_wider"]) == (arch.ffn.k, arch.ffn.hidden,
                                                                                          arch.ffn.wider)
    assert (config["rope_theta"], config["rms_norm_eps"], config["tie_word_embeddings"]) == (
        arch.rope_theta, arch.norm_eps, arch.tie_embeddings)
    for name in ("configuration_prism.py", "modeling_prism.py"):  # travels without prism-nas
        source = (tmp_path / "m" / name).read_text()
        assert "nas" not in {line.split()[1].split(".")[0] for line in source.splitlines()
                             if line.startswith(("import ", "from "))}
    hf = load(tmp_path / "m")
    assert type(hf).__name__ == "PrismForCausalLM"
    assert sum(p.numel() for p in hf.parameters()) == arch.n_params()["total"]
    if arch.tie_embeddings:
        assert hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()
    idx = torch.randint(0, arch.vocab_size, (3, 41))
    with torch.no_grad():
        ours, theirs = model(idx), hf(input_ids=idx).logits
    assert relative_error(ours, theirs) < 1e-5
    # the loss: labels are the inputs, shifted inside, as HF models do
    with torch.no_grad():
        loss = hf(input_ids=idx, labels=idx).loss
        ours_loss = model(idx[:, :-1], idx[:, 1:])
    assert abs(float(loss) - float(ours_loss)) < 1e-5 * float(ours_loss)


def test_generate_with_the_cache_feeds_one_token_a_step_and_gives_the_tokens_of_no_cache(prism_dir):
    _, path = prism_dir
    hf = load(path)
    lengths: list[int] = []
    hf.model.register_forward_pre_hook(lambda module, args, kwargs: lengths.append(kwargs["input_ids"].shape[1]),
                                       with_kwargs=True)
    prompt = torch.randint(0, PRISM.vocab_size, (2, 7))
    cached = hf.generate(prompt, max_new_tokens=32, do_sample=False, use_cache=True)
    assert lengths == [7] + [1] * 31  # the prompt once, then one new token a step: not quadratic
    lengths.clear()
    uncached = hf.generate(prompt, max_new_tokens=32, do_sample=False, use_cache=False)
    assert lengths == list(range(7, 7 + 32))
    assert cached.shape == (2, 7 + 32) and torch.equal(cached, uncached)
    # a left-padded batch generates what each prompt generates alone
    short = prompt[1, 3:]
    padded = torch.stack([prompt[0], torch.cat([torch.zeros(3, dtype=torch.long), short])])
    mask = torch.ones_like(padded)
    mask[1, :3] = 0
    batch = hf.generate(padded, attention_mask=mask, max_new_tokens=32, do_sample=False)
    alone = hf.generate(short[None], max_new_tokens=32, do_sample=False)
    assert torch.equal(batch[0], cached[0]) and torch.equal(batch[1, 7:], alone[0, 4:])


def gradients(model, idx: torch.Tensor) -> list[torch.Tensor]:
    """Every parameter's gradient of the loss on ``idx`` (``backward``: transformers 4's reentrant checkpointing
    refuses ``torch.autograd.grad``)."""
    model.zero_grad()
    model(input_ids=idx, labels=idx).loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    return grads


def test_training_lowers_the_loss_checkpointing_keeps_the_gradients_and_save_pretrained_round_trips(prism_dir,
                                                                                                   tmp_path):
    _, path = prism_dir
    hf = load(path).train()
    idx = torch.randint(0, PRISM.vocab_size, (4, 33), generator=torch.Generator().manual_seed(1))
    calls = []
    for layer in hf.model.layers:
        layer.register_forward_pre_hook(lambda *args: calls.append(1))
    plain = gradients(hf, idx)
    assert len(calls) == PRISM.n_layers
    enable = getattr(hf, "activation_checkpointing_enable", None) or hf.gradient_checkpointing_enable
    enable()
    calls.clear()
    checkpointed = gradients(hf, idx)
    assert len(calls) == 2 * PRISM.n_layers  # every layer ran again in the backward pass
    for a, b in zip(plain, checkpointed):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    (getattr(hf, "activation_checkpointing_disable", None) or hf.gradient_checkpointing_disable)()
    optimizer = torch.optim.AdamW(hf.parameters(), lr=3e-3)
    losses = []
    for _ in range(8):
        loss = hf(input_ids=idx, labels=idx).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.8 * losses[0], losses
    hf.eval().save_pretrained(tmp_path / "saved")
    assert {"modeling_prism.py", "configuration_prism.py", "model.safetensors"} <= {
        p.name for p in (tmp_path / "saved").iterdir()}
    again = load(tmp_path / "saved")
    with torch.no_grad():
        assert torch.equal(hf(input_ids=idx).logits, again(input_ids=idx).logits)
    assert again.config.num_attention_heads == list(PRISM.heads) and again.config.rope_theta == PRISM.rope_theta


def test_trainer_trains_an_exported_directory_saves_it_and_it_reloads_with_the_same_logits(prism_dir, tmp_path):
    """Issue 52: the docs promise training with transformers, whose ``Trainer`` needs accelerate (the ``bench``
    extra installs it): a few steps of ``Trainer`` on the exported Prism directory (K = 3 sub-MLPs, a head count per
    layer), ``save_model``, and the saved directory computes the trained model's logits exactly."""
    import importlib.util

    assert importlib.util.find_spec("accelerate"), "Trainer needs accelerate, which the bench extra installs"
    _, path = prism_dir
    hf = load(path).train()
    generator = torch.Generator().manual_seed(2)
    windows = [torch.randint(0, PRISM.vocab_size, (33,), generator=generator) for _ in range(16)]
    data = [{"input_ids": w, "labels": w} for w in windows]
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "run"), max_steps=6, per_device_train_batch_size=4,
                                          learning_rate=3e-3, lr_scheduler_type="constant", logging_steps=1,
                                          save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True, seed=0)
    trainer = transformers.Trainer(model=hf, args=args, train_dataset=data)
    with transformers_log():  # its progress and info lines, not this test's output
        trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 6 and losses[-1] < losses[0], losses
    trainer.save_model(str(tmp_path / "saved"))
    assert {"modeling_prism.py", "configuration_prism.py", "model.safetensors", "config.json"} <= {
        p.name for p in (tmp_path / "saved").iterdir()}
    again = load(tmp_path / "saved")
    idx = torch.stack(windows[:3])
    with torch.no_grad():
        assert torch.equal(hf.eval()(input_ids=idx).logits, again(input_ids=idx).logits)


def test_grouped_query_heads_equal_full_heads_holding_each_key_value_head_once_per_group(prism_dir):
    """Per-layer ``num_key_value_heads`` (the grouped-query attention a later shape may ask for) needs no new format:
    a model with 1 and 2 key/value heads in layers of 2 and 4 equals full attention whose heads of a group share
    their key/value weights (HF's ``repeat_kv`` order)."""
    _, path = prism_dir
    config = transformers.AutoConfig.from_pretrained(path, trust_remote_code=True)
    config.num_attention_heads, config.num_key_value_heads = [2, 4, 16], [1, 2, 4]
    torch.manual_seed(3)
    gqa = transformers.AutoModelForCausalLM.from_config(config, trust_remote_code=True).eval()
    config.num_key_value_heads = [2, 4, 16]
    full = transformers.AutoModelForCausalLM.from_config(config, trust_remote_code=True).eval()
    state = gqa.state_dict()
    for layer, (h, kv) in enumerate(zip([2, 4, 16], [1, 2, 4])):
        dim = PRISM.d_model // h
        for name in ("k_proj", "v_proj"):
            key = f"model.layers.{layer}.self_attn.{name}.weight"
            state[key] = state[key].view(kv, dim, -1).repeat_interleave(h // kv, dim=0).reshape(h * dim, -1)
    full.load_state_dict(state)
    idx = torch.randint(0, PRISM.vocab_size, (2, 19))
    with torch.no_grad():
        assert relative_error(gqa(input_ids=idx).logits, full(input_ids=idx).logits) < 1e-6
    assert gqa.model.layers[0].self_attn.k_proj.weight.shape == (24, PRISM.d_model)  # 1 head of 24, not 2


# a grouped-query Prism shape: 2 of 4 query heads per key/value head, multi-query in the last layer, K=2
PRISM_GQA = ArchConfig(n_layers=3, d_model=48, heads=(2, 4, 8), kv_heads=(2, 2, 1), ffn=FFNShape(2, 30, wider=1),
                       vocab_size=300, tie_embeddings=False)


def test_a_grouped_query_shape_exports_with_its_key_value_heads_and_computes_the_projects_logits(tmp_path):
    """``kv_heads`` travel as per-layer ``num_key_value_heads``: the k and v projections load with kv_l heads each,
    and the exported model (remote code, HF's repeat_kv order) computes the project's logits and loss."""
    model = project_model(PRISM_GQA)
    write_model_dir(PRISM_GQA, tmp_path / "gqa", "hf", weights=model.state_dict(), context=64)
    config = json.loads((tmp_path / "gqa" / "config.json").read_text())
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == ([2, 4, 8], [2, 2, 1])
    hf = load(tmp_path / "gqa")
    for layer, (h, kv) in enumerate(zip(PRISM_GQA.heads, PRISM_GQA.kv_heads)):
        attention = hf.model.layers[layer].self_attn
        head_dim = PRISM_GQA.d_model // h
        assert attention.k_proj.weight.shape == attention.v_proj.weight.shape == (kv * head_dim, PRISM_GQA.d_model)
        assert attention.q_proj.weight.shape == (PRISM_GQA.d_model, PRISM_GQA.d_model)
    assert sum(p.numel() for p in hf.parameters()) == PRISM_GQA.n_params()["total"]
    idx = torch.randint(0, PRISM_GQA.vocab_size, (3, 41))
    with torch.no_grad():
        assert relative_error(model(idx), hf(input_ids=idx).logits) < 1e-5
        assert abs(float(hf(input_ids=idx, labels=idx).loss) - float(model(idx[:, :-1], idx[:, 1:]))) < 1e-5
    card = (tmp_path / "gqa" / "README.md").read_text()
    assert "key/value heads per layer (grouped-query attention): 2, 2, 1" in card
    assert "key/value head count differs by layer" in llama_refusal(PRISM_GQA.replace(heads=[8, 8, 8],
                                                                                      kv_heads=[8, 4, 4]))
    assert llama_refusal(uniform(2, 64, 4, 320, FFNShape(1, 176)).replace(kv_heads=[2, 2])) is None


def test_a_uniform_grouped_query_baseline_exports_as_a_stock_llama(tmp_path):
    arch = BASELINE.replace(kv_heads=[1, 1])  # multi-query: LlamaConfig's num_key_value_heads=1
    model = project_model(arch)
    write_model_dir(arch, tmp_path / "llama-mqa", "llama", weights=model.state_dict(), context=64)
    assert json.loads((tmp_path / "llama-mqa" / "config.json").read_text())["num_key_value_heads"] == 1
    hf = load(tmp_path / "llama-mqa", remote=False)
    assert type(hf).__name__ == "LlamaForCausalLM"
    idx = torch.randint(0, arch.vocab_size, (2, 33))
    with torch.no_grad():
        assert relative_error(model(idx), hf(input_ids=idx).logits) < 1e-5


def test_the_baseline_exports_as_a_stock_llama_with_no_remote_code(tmp_path):
    arch = BASELINE.replace(rope_theta=50000.0, norm_eps=1e-6, tie_embeddings=False)
    model = project_model(arch)
    done = write_model_dir(arch, tmp_path / "llama", "llama", weights=model.state_dict(), context=128)
    assert done.files == ("README.md", "config.json", "model.safetensors", "nas-export.json")
    hf = load(tmp_path / "llama", remote=False)
    assert type(hf) is transformers.LlamaForCausalLM
    assert hf.config.rope_parameters["rope_theta"] == 50000.0 and hf.config.rms_norm_eps == 1e-6
    idx = torch.randint(0, arch.vocab_size, (2, 50))
    with torch.no_grad():
        assert relative_error(model(idx), hf(input_ids=idx).logits) < 1e-5
    generated = hf.generate(idx[:1, :5], max_new_tokens=32, do_sample=False)
    assert generated.shape == (1, 37)  # no end-of-text token cut it short (LlamaConfig's default eos is 2)


def test_a_shape_llama_cannot_hold_and_a_failed_write_leave_nothing_behind(tmp_path, monkeypatch):
    import nas.hf.export

    with pytest.raises(UsageError, match="no LLaMA: its head count differs by layer"):
        write_model_dir(PRISM, tmp_path / "m", "llama")
    assert list(tmp_path.iterdir()) == []

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(nas.hf.export, "save_file", disk_full)
    with pytest.raises(UsageError, match="cannot write -o .*No space left on device"):
        write_model_dir(BASELINE, tmp_path / "m", "hf")
    assert list(tmp_path.iterdir()) == []


def tree(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (relative name -> sha256): what a refused command must leave as it was."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_every_file_is_shared_as_the_folder_is_and_the_record_names_what_the_export_wrote(tmp_path):
    """Issue 52: model.safetensors came out 0600 (safetensors writes it private) beside 0644 files."""
    umask = os.umask(0o022)
    try:
        done = write_model_dir(BASELINE, tmp_path / "m", "hf")
    finally:
        os.umask(umask)
    assert {name: oct(stat.S_IMODE((tmp_path / "m" / name).stat().st_mode)) for name in done.files} == \
        dict.fromkeys(done.files, "0o644")
    record = json.loads((tmp_path / "m" / MANIFEST).read_text())
    assert set(record["files"]) == set(done.files) - {MANIFEST}
    assert record["files"]["model.safetensors"] == hashlib.sha256((tmp_path / "m" / WEIGHTS).read_bytes()).hexdigest()


def test_force_replaces_only_the_files_an_export_wrote_and_carries_the_users_over(tmp_path, monkeypatch):
    """Issue 52: --force replaced any folder holding a config.json, the files the user added in an exported one too;
    now only an export's own files, unchanged since, and the user's entries come along into the new directory."""
    out = tmp_path / "m"
    write_model_dir(BASELINE, out, "hf")
    (out / "tokenizer.json").write_text("{}")
    (out / "runs").mkdir()
    (out / "runs" / "trainer_state.json").write_text("{\"step\": 3}")
    mine = {k: v for k, v in tree(out).items() if k in ("tokenizer.json", "runs/trainer_state.json")}
    done = write_model_dir(PRISM, out, "hf", force=True)
    assert done.kept == ("runs", "tokenizer.json")
    assert {k: v for k, v in tree(out).items() if k in mine} == mine
    assert json.loads((out / "config.json").read_text())["num_attention_heads"] == list(PRISM.heads)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no folder left aside

    (out / WEIGHTS).write_bytes((out / WEIGHTS).read_bytes()[:-4] + b"\0\0\0\0")  # a training saved over it
    before = tree(out)
    with pytest.raises(UsageError, match="'model.safetensors' changed since nas export wrote it, and --force "
                                         "would lose it: move it away or give a new folder"):
        write_model_dir(PRISM, out, "hf", force=True)
    assert tree(out) == before

    project = tmp_path / "project"  # the case: a project folder holding a config.json, notes, a storage
    project.mkdir()
    for name, text in (("config.json", '{"name": "mine"}'), ("notes.txt", "mine"), ("base.db", "a storage")):
        (project / name).write_text(text)
    before = tree(project)
    with pytest.raises(UsageError, match="holds 'base.db', 'notes.txt', which no nas export wrote "
                                         r"\(it has no nas-export.json\)"):
        write_model_dir(BASELINE, project, "hf", force=True)
    with pytest.raises(UsageError, match="holds '.*tokenizer.json', which this command reads: --force never "
                                         "replaces it"):  # a storage or checkpoint the command reads
        write_model_dir(BASELINE, out, "hf", force=True, reads=[project / "base.db", out / "tokenizer.json"])
    monkeypatch.chdir(project)
    for given, where in ((Path("."), "the working directory"), (Path(".."), "a folder above the working directory")):
        with pytest.raises(UsageError, match=f"is {where}: the export replaces its folder whole"):
            write_model_dir(BASELINE, given, "hf", force=True)
    assert tree(project) == before

    legacy = tmp_path / "legacy"  # an export made before the record: known by its exact file list
    write_model_dir(BASELINE, legacy, "llama")
    (legacy / MANIFEST).unlink()
    (legacy / "tokenizer.json").write_text("{}")
    with pytest.raises(UsageError, match="holds 'tokenizer.json', which no nas export wrote"):
        write_model_dir(BASELINE, legacy, "hf", force=True)
    (legacy / "tokenizer.json").unlink()
    assert write_model_dir(BASELINE, legacy, "hf", force=True).kept == ()

    mine = tmp_path / "mine"  # a user's own model with the same three file names: its card names no prism-nas
    mine.mkdir()
    for name, text in (("README.md", "# my model\n"), ("config.json", '{"my": "config"}'),
                       ("model.safetensors", "precious weights")):
        (mine / name).write_text(text)
    with pytest.raises(UsageError, match="which no nas export wrote"):
        write_model_dir(BASELINE, mine, "llama", force=True)
    assert (mine / "model.safetensors").read_text() == "precious weights"

    clashing = tmp_path / "clashing"  # a llama export, then a user's file named as one the hf layout writes
    write_model_dir(BASELINE, clashing, "llama")
    (clashing / "modeling_prism.py").write_text("# mine")
    for _ in range(2):
        with pytest.raises(UsageError, match="holds 'modeling_prism.py', which no export wrote there and this one"):
            write_model_dir(BASELINE, clashing, "hf", force=True)
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".clashing.")]  # a whole model was left
    assert (clashing / "modeling_prism.py").read_text() == "# mine"  # behind, hidden, each try

    link = tmp_path / "link"  # the export renames a folder into place: it replaced the link, and moved the user's
    link.symlink_to(clashing)  # files out of the folder it named
    with pytest.raises(UsageError, match=f"-o '{link}' is a symbolic link to '{clashing}': give the folder itself"):
        write_model_dir(BASELINE, link, "llama", force=True)
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")  # it was called "a file"
    with pytest.raises(UsageError, match="is a symbolic link to .*nowhere', which does not exist"):
        write_model_dir(BASELINE, tmp_path / "dangling", "llama")
    assert link.is_symlink() and (clashing / "modeling_prism.py").read_text() == "# mine"


def test_weights_of_another_shape_are_refused(tmp_path):
    other = Transformer(BASELINE.replace(heads=[2, 2], ffn={"k": 1, "hidden": 160})).state_dict()
    with pytest.raises(UsageError, match="not those of h=4x2 K1x176 d64 L2: .*size mismatch"):
        write_model_dir(BASELINE, tmp_path / "m", "hf", weights=other)
    assert list(tmp_path.iterdir()) == []


def test_the_card_states_the_shape_the_study_row_and_whether_the_weights_are_trained():
    row = {"rank": 2, "study": "s", "space": "prism", "preset": "cpu", "seeds": 3, "adjusted_loss": 3.2101,
           "mean_loss": 3.2150, "ci95": 0.0123, "is_baseline": False, "tied_with_best": True,
           "expected_gain_pct": 0.84, "expected_gain_low": -0.21, "expected_gain_high": 1.9, "paired_gain_pct": 1.1,
           "paired_gain_low": 0.2, "paired_gain_high": 2.0, "paired_seeds": 2}
    fresh = model_card(PRISM, "prism", Provenance(row=row, data="builtin"))
    for text in ("# h=2x1,4x1,16x1 K3x20+2 d48 L3",
                 "attention heads per layer: 2, 4, 16",
                 "K=3 stacked residual SwiGLU sub-MLPs of hidden size 20 (Hourglass); the first 2 sub-MLPs have 21",
                 "study `s` (space prism, proxy preset cpu): rank 2, tied with the best",
                 "proxy score (seed-adjusted validation loss, the rank): 3.2101",
                 "mean proxy loss over 3 seeds: 3.2150 ± 0.0123",
                 "expected gain over the baseline: +0.84 % [-0.21, +1.90] (95 % posterior)",
                 "paired gain over the baseline on 2 common seeds: +1.10 % [+0.20, +2.00]",
                 "**freshly initialised, untrained**", "trust_remote_code=True", "`--data builtin`"):
        assert text in fresh, text
    early = model_card(PRISM, "prism", Provenance(row={**row, "expected_gain_low": None, "expected_gain_high": None,
                                                        "ci95": None, "seeds": 1}))
    assert "expected gain over the baseline: +0.84 % (not shrunk yet: too few seeds)" in early
    assert "mean proxy loss over 1 seed: 3.2150\n" in early and "posterior" not in early
    run = {"path": "runs/w/checkpoint.pt", "step": 15, "steps": 20, "tokens": 1920, "seq_len": 32, "val_loss": 3.5,
           "val_tokens": 1536}
    trained = model_card(BASELINE, "llama", Provenance(run=run))
    assert "step 15 of 20, 1,920 tokens of context 32" in trained and "3.5000 (after 1,536 tokens)" in trained
    assert "freshly" not in trained and "a stock LlamaForCausalLM" in trained and "not linked to a study" in trained


# ----------------------------------------------------------------- the command line
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A tiny study, `nas export` rows, a `nas train --out` run of its best shape and one of a shape outside it."""
    from nas.study.config import SearchConfig
    from nas.study.parallel import run_search
    from search_spaces.factory import SpaceOptions

    root = tmp_path_factory.mktemp("cli")
    storage = f"sqlite:///{root / 'nas.db'}"
    monkeypatch = pytest.MonkeyPatch()
    import runners.cores

    monkeypatch.setattr(runners.cores, "available_cores", lambda: 1)
    run_search(SearchConfig(space=SpaceOptions(space="prism"), preset="tiny", storage=storage, trials=4,
                            study_name="s", train_overrides=(("tokens", 2048),)))
    runner = CliRunner()
    result = runner.invoke(app(), ["export", "--storage", storage, "-o", str(root / "best.json")])
    assert result.exit_code == 0, result.output
    other = ArchConfig(n_layers=4, d_model=32, heads=(2, 2, 2, 2), ffn=FFNShape(1, 88), vocab_size=256)
    (root / "other.json").write_text(other.to_json())
    for name, config in (("best", "best.json"), ("other", "other.json")):
        result = runner.invoke(app(), ["train", "--config", str(root / config), "--preset", "tiny", "--tokens", "1024",
                                       "--out", str(root / name), "--threads", "1"])
        assert result.exit_code == 0, result.output
    yield root, storage
    monkeypatch.undo()


def app():
    from nas.cli import app

    return app


def nas(*args: str):
    return CliRunner().invoke(app(), list(args))


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> Path:
    """A study made without training (``benchmarks.synthetic_studies``): what the refusals need, in seconds."""
    import optuna

    from benchmarks.synthetic_studies import SyntheticSpec, synthetic_study

    root = tmp_path_factory.mktemp("synthetic")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    synthetic_study(SyntheticSpec(space="prism", preset="tiny", trials=6), storage=f"sqlite:///{root / 'base.db'}",
                    name="tiny")
    return root / "base.db"


@pytest.mark.parametrize("cwd, args, says", [
    ("proj", ["-o", ".", "--force"], "-o 'PROJ' is the working directory: the export replaces its folder whole"),
    ("", ["-o", "proj", "--force"], "-o 'PROJ' holds 'PROJ/base.db', which this command reads: --force never "
                                    "replaces it"),
    ("", ["-o", "proj", "--force", "--storage", "sqlite:///elsewhere.db"], "-o 'PROJ' holds 'base.db', 'notes.txt', "
                                                                           "which no nas export wrote"),
    ("proj", ["-o", "m", "--top", "0"], "--top 0 goes with --format json (rows)"),
], ids=["the-working-directory", "the-storage-it-reads", "a-folder-no-export-wrote", "top-with-hf"])
def test_force_never_replaces_a_folder_no_export_wrote_nor_what_the_command_reads(synthetic, tmp_path, monkeypatch,
                                                                                   cwd, args, says):
    """Issue 52: in a project folder holding a non-model config.json, a text file and the study's own SQLite file,
    ``nas export --format hf -o . --force`` exited 0 and deleted the text file and the database."""
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "base.db").write_bytes(synthetic.read_bytes())
    (proj / "config.json").write_text('{"project": "mine"}')
    (proj / "notes.txt").write_text("mine")
    (tmp_path / "elsewhere.db").write_bytes(synthetic.read_bytes())
    monkeypatch.chdir(tmp_path / cwd)
    before = tree(tmp_path)
    storage = [] if "--storage" in args else ["--storage", f"sqlite:///{proj / 'base.db'}"]
    result = nas("export", *storage, "--format", "hf", *args)
    assert result.exit_code == 2, result.output
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: "), result.stderr
    assert says.replace("PROJ", str(proj)) in result.stderr, result.stderr
    assert tree(tmp_path) == before


@pytest.mark.slow
def test_export_a_study_row_fresh_and_a_trained_checkpoint_with_its_weights(runs, tmp_path):
    root, storage = runs
    best = json.loads((root / "best.json").read_text())[0]
    fresh = nas("export", "--storage", storage, "--format", "hf", "-o", str(tmp_path / "fresh"))  # --rank 1
    assert fresh.exit_code == 0, fresh.output
    assert "freshly initialised weights" in fresh.stderr and "row 1 of study 's'" in fresh.stderr
    card = (tmp_path / "fresh" / "README.md").read_text()
    assert f"# {best['shape']}" in card and "rank 1" in card and "freshly initialised" in card
    assert f"{best['adjusted_loss']:.4f}" in card
    assert json.loads((tmp_path / "fresh" / "config.json").read_text())["max_position_embeddings"] == 32

    trained = nas("export", "--storage", storage, "--study-name", "s", "--checkpoint", str(root / "best"),
                  "--format", "hf", "-o", str(tmp_path / "trained"))
    assert trained.exit_code == 0, trained.output
    assert "trained weights of" in trained.stderr and "row 1 of study 's'" in trained.stderr
    checkpoint = torch.load(root / "best" / "checkpoint.pt", weights_only=True)
    model = Transformer(ArchConfig.from_dict(best["arch"])).eval()
    model.load_state_dict(checkpoint["model"])
    hf = load(tmp_path / "trained")
    idx = torch.randint(0, 256, (2, 30))
    with torch.no_grad():
        assert relative_error(model(idx), hf(input_ids=idx).logits) < 1e-5
    assert "step 8 of 8, 1,024 tokens of context 32" in (tmp_path / "trained" / "README.md").read_text()

    alone = nas("export", "--checkpoint", str(root / "best" / "checkpoint.pt"), "--format", "hf", "-o",
                str(tmp_path / "alone"))  # no study: the shape from the run's result.json
    assert alone.exit_code == 0, alone.output
    assert "not linked to a study" in (tmp_path / "alone" / "README.md").read_text()
    ranked = nas("export", "--storage", storage, "--checkpoint", str(root / "best"), "--rank", "1", "--format", "hf",
                 "-o", str(tmp_path / "ranked"))  # the storage's only study, as --study-name's help says
    assert ranked.exit_code == 0 and "row 1 of study 's'" in ranked.stderr, ranked.output
    # the storage that --rank reads, kept by the user inside that export's folder: --force must not replace it (the
    # read was not checked without --study-name, and the file was carried into the new folder as a user's own)
    from search_helpers import copy_study

    inside = copy_study(root / "nas.db", tmp_path / "ranked" / "nas.db")
    before = tree(tmp_path / "ranked")
    again = nas("export", "--storage", inside, "--checkpoint",
                str(root / "best"), "--rank", "1", "--format", "hf", "-o", str(tmp_path / "ranked"), "--force")
    assert again.exit_code == 2 and "which this command reads: --force never replaces it" in again.stderr, \
        again.output
    assert tree(tmp_path / "ranked") == before

    baseline = next(r for r in json.loads((root / "best.json").read_text()) if r["is_baseline"])
    llama = nas("export", "--storage", storage, "--rank", "baseline", "--format", "llama", "-o",
                str(tmp_path / "llama"))
    assert llama.exit_code == 0, llama.output
    assert f"row {baseline['rank']} of study 's'" in llama.stderr and "(the baseline)" in (
        tmp_path / "llama" / "README.md").read_text()
    assert type(load(tmp_path / "llama", remote=False)) is transformers.LlamaForCausalLM


@pytest.mark.slow
def test_a_checkpoint_is_matched_to_its_study_row_or_to_the_row_a_rerun_carried_to_it(runs, tmp_path):
    import optuna

    from nas.study.records import RERUN_MARK, rerun_study_name

    root, storage = runs
    rows = json.loads((root / "best.json").read_text())
    args = ["export", "--storage", storage, "--study-name", "s", "--checkpoint", str(root / "other"), "--format",
            "hf"]
    refused = nas(*args, "-o", str(tmp_path / "m"))
    assert refused.exit_code == 2 and "which is not a shape of study 's' nor a re-run of one" in refused.stderr
    # the `other` run recorded as a re-run of row 2's shape, as `nas rerun` records one it carried to a target
    # (the attrs reports.reruns.read_reruns reads)
    study = optuna.create_study(storage=storage, study_name=rerun_study_name("s", "tiny"))
    study.set_user_attr(RERUN_MARK, "s")
    other = json.loads((root / "other" / "result.json").read_text())
    study.add_trial(optuna.trial.create_trial(value=other["val_loss"], user_attrs={
        "proxy_key": rows[1]["key"], "key": ArchConfig.from_dict(other["arch"]).key(), "seed": 0}))
    matched = nas(*args, "-o", str(tmp_path / "m"))
    assert matched.exit_code == 0, matched.output
    assert f"row {rows[1]['rank']} of study 's'" in matched.stderr
    card = (tmp_path / "m" / "README.md").read_text()
    assert f"rank {rows[1]['rank']}" in card and "# h=2x4 K1x88 d32 L4" in card  # the row's scores, the run's shape
    wrong = nas(*args, "--rank", "1", "-o", str(tmp_path / "m2"))
    assert wrong.exit_code == 2 and "not the shape of row 1 of study 's'" in wrong.stderr


@pytest.mark.slow
@pytest.mark.parametrize("args, says", [
    (["--rank", "99", "--format", "hf", "-o", "m"], "--rank 99 is not a row of study 's': its leaderboard ranks 1 to"),
    (["--rank", "best", "--format", "hf", "-o", "m"], "--rank 'best' is invalid: give a rank (1 = the best) or "
                                                      "baseline"),
    (["--rank", "²", "--format", "hf", "-o", "m"], "--rank '²' is invalid: give a rank"),  # a ValueError traceback
    (["--format", "hf"], "--format hf writes a model directory: give -o DIR"),
    (["--format", "onnx", "-o", "m"], "onnx"),
    (["--checkpoint", "CHECKPOINT", "-o", "rows.json"], "--checkpoint and --force go with --format hf or llama"),
    (["--checkpoint", "nowhere", "--format", "hf", "-o", "m"], "--checkpoint 'nowhere' does not exist"),
    (["--checkpoint", "pipe", "--format", "hf", "-o", "m"], "--checkpoint 'pipe' is a FIFO (named pipe): give the "
                                                           "folder"),  # it said "does not exist"
    # tracebacks: a name too long for the file system, an arch.json beside the checkpoint that is not UTF-8
    (["--checkpoint", "g" * 300, "--format", "hf", "-o", "m"], "its name is too long for this file system"),
    (["--checkpoint", "BADARCH", "--format", "hf", "-o", "m"], "'BADARCH/arch.json' cannot be read as a shape: "
                                                              "'utf-8' codec can't decode"),
    (["--checkpoint", "MIXED", "--format", "hf", "-o", "m"], "but 'MIXED/result.json' beside it is another shape"),
    (["--format", "hf", "-o", "full"], "-o 'TMP/full' exists and is not empty: give a new folder, or --force"),
    (["--format", "hf", "-o", "full", "--force"], "holds 'notes.txt', which no nas export wrote"),
    (["--format", "hf", "--top", "1", "-o", "m"], "--top 1 goes with --format json (rows); --format hf writes one "
                                                  "shape: pick it with --rank N"),
    (["--format", "llama", "--rank", "PRISM_RANK", "-o", "m"], "no LLaMA: its head count differs by layer"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(runs, tmp_path, monkeypatch, args, says):
    root, storage = runs
    monkeypatch.chdir(tmp_path)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    mixed = tmp_path / "MIXED"
    mixed.mkdir()
    (mixed / "checkpoint.pt").write_bytes((root / "best" / "checkpoint.pt").read_bytes())
    (mixed / "result.json").write_text((root / "other" / "result.json").read_text())
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "BADARCH").mkdir()
    (tmp_path / "BADARCH" / "checkpoint.pt").write_bytes((root / "best" / "checkpoint.pt").read_bytes())
    (tmp_path / "BADARCH" / "arch.json").write_bytes(b"\xff\xfe\x00")
    prism_rank = next(r["rank"] for r in json.loads((root / "best.json").read_text()) if len(set(r["heads"])) > 1)
    args = [{"CHECKPOINT": str(root / "best"), "PRISM_RANK": str(prism_rank)}.get(a, a) for a in args]
    before = sorted(p.name for p in tmp_path.iterdir())
    result = nas("export", "--storage", storage, "--study-name", "s", *args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert says.replace("TMP", str(tmp_path)) in lines[0], lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing half-written, no temporary folder
    assert (tmp_path / "full" / "notes.txt").read_text() == "mine"


@pytest.mark.slow
def test_force_replaces_an_exports_directory_whole_keeping_what_the_user_added(runs, tmp_path):
    root, storage = runs
    out = tmp_path / "m"
    first = nas("export", "--storage", storage, "--format", "hf", "-o", str(out))
    assert first.exit_code == 0, first.output
    (out / "tokenizer.json").write_text("{}")  # something the user added: carried over, and said so
    again = nas("export", "--storage", storage, "--checkpoint", str(root / "best"), "--study-name", "s", "--format",
                "hf", "-o", str(out), "--force")
    assert again.exit_code == 0, again.output
    assert (out / "tokenizer.json").read_text() == "{}" and "step 8 of 8" in (out / "README.md").read_text()
    assert again.stderr.count("\n") == 1 and "; kept tokenizer.json (not written by an export)" in again.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_the_default_row_is_the_answers_pick_even_where_the_board_ranks_it_lower():
    """After a race the answer's pick was rank 3 while the export's default, "1, the best", wrote rank 1."""
    from types import SimpleNamespace

    from nas.cli.export_hf import pick_row

    rows = [{"rank": r, "is_baseline": r == 2, "is_answer_pick": r == 3, "key": f"k{r}"} for r in (1, 2, 3)]
    data = SimpleNamespace(name="s")
    assert pick_row(data, rows, None, None)["rank"] == 3 and pick_row(data, rows, 1, None)["rank"] == 1
    assert pick_row(data, [{**r, "is_answer_pick": False} for r in rows], None, None)["rank"] == 1


@pytest.mark.parametrize("name", ["m" * 255, "m" * 242, "é" * 127], ids=["255-bytes", "242-bytes", "254-bytes-utf8"])
def test_a_folder_name_of_up_to_255_bytes_is_written_and_replaced(synthetic, tmp_path, monkeypatch, name):
    """A name of 242-255 bytes is a valid folder, but its hidden sibling ``.NAME.XXXXXXXX.tmp`` was not: the export
    was refused as "too long for this file system". The hidden names are cut to fit. In a project folder that also
    holds the study being read and the user's notes, and with the user's own file inside the export, the forced
    replacement (its old folder moved aside, then removed) keeps every one of them and leaves nothing else."""
    from search_helpers import copy_study

    monkeypatch.chdir(tmp_path)
    storage = copy_study(synthetic, tmp_path / "base.db")
    (tmp_path / "notes.txt").write_text("mine")
    first = nas("export", "--storage", storage, "--format", "hf", "-o", name)
    assert first.exit_code == 0, first.output
    (tmp_path / name / "tokenizer.json").write_text("{}")  # the user's own, carried into the new folder
    study_and_notes = {k: v for k, v in tree(tmp_path).items() if not k.startswith(name)}
    again = nas("export", "--storage", storage, "--format", "hf", "--rank", "2", "-o", name, "--force")  # .old aside
    assert again.exit_code == 0, again.output
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["base.db", "notes.txt", name])
    assert {k: v for k, v in tree(tmp_path).items() if not k.startswith(name)} == study_and_notes
    assert (tmp_path / name / "tokenizer.json").read_text() == "{}" and (tmp_path / name / "config.json").exists()


def test_the_wrote_line_shows_the_folder_as_every_message_shows_a_path(synthetic, tmp_path, monkeypatch):
    """`wrote ...` printed -o unquoted: a name holding a newline split the line in two."""
    monkeypatch.chdir(tmp_path)
    result = nas("export", "--storage", f"sqlite:///{synthetic}", "--format", "hf", "-o", "odd\nname")
    assert result.exit_code == 0, result.output
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(f"wrote '{tmp_path}/odd\\nname' ("), \
        result.stderr


STOPPED_EXPORT = """
import os, signal, sys
import nas.hf.export as export
import nas.hf.target as target

where, stop_signal = sys.argv.pop(1), getattr(signal, sys.argv.pop(1))
real_save, real_replace = export.save_file, target.os.replace


def save_then_stop(*args, **kwargs):  # the signal while the hidden folder is half written
    real_save(*args, **kwargs)
    if where == "writing":
        os.kill(os.getpid(), stop_signal)


class Os:  # the signal as the new folder is about to take the old one's place (the user's files moved into it)
    def __getattr__(self, name):
        return getattr(os, name)

    def replace(self, source, destination):
        if where == "replacing" and str(source).endswith(".tmp"):
            os.kill(os.getpid(), stop_signal)
        return real_replace(source, destination)


export.save_file, target.os = save_then_stop, Os()
from nas.cli import main
sys.argv = ["nas", *sys.argv[1:]]
main()
"""


@pytest.mark.parametrize("where, stop_signal", [("writing", "SIGTERM"), ("replacing", "SIGTERM"),
                                                ("writing", "SIGHUP"), ("replacing", "SIGHUP")])
def test_an_export_stopped_by_sigterm_or_a_hangup_leaves_no_hidden_folder_and_the_old_export_whole(
        synthetic, tmp_path, where, stop_signal):
    """A `kill` (SIGTERM) or a closed terminal (SIGHUP) ended `nas export` without its cleanup: the hidden
    `.NAME.*.tmp` folder it was writing stayed beside -o. It now stops as on Ctrl-C, in one line, and puts back what
    it had moved."""
    storage = f"sqlite:///{synthetic}"
    out = tmp_path / "m"
    first = nas("export", "--storage", storage, "--format", "hf", "-o", str(out))
    assert first.exit_code == 0, first.output
    (out / "tokenizer.json").write_text("{}")  # the user's own file, moved into the new folder before the swap
    before = tree(tmp_path)
    stopped = stopped_export(tmp_path, where, stop_signal, storage, out)
    assert stopped.returncode == 130, stopped.stderr
    assert stopped.stderr.count("\n") == 1 and "Traceback" not in stopped.stderr, stopped.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"] and tree(tmp_path) == before


def stopped_export(cwd: Path, where: str, stop_signal: str, storage: str, out: Path, hangup_ignored: bool = False):
    """``nas export --rank 2 -o out --force`` sent ``stop_signal`` by itself at ``where`` (``STOPPED_EXPORT``);
    ``hangup_ignored`` starts it as ``nohup`` does."""
    import signal
    import subprocess
    import sys

    def as_started() -> None:  # a terminal's default, or nohup's; never the test runner's (xdist's ignores it)
        signal.signal(signal.SIGHUP, signal.SIG_IGN if hangup_ignored else signal.SIG_DFL)

    return subprocess.run([sys.executable, "-c", STOPPED_EXPORT, where, stop_signal, "export", "--storage", storage,
                           "--format", "hf", "--rank", "2", "-o", str(out), "--force"], cwd=cwd, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONWARNINGS": "ignore"},
                          preexec_fn=as_started)


def test_an_export_started_with_nohup_ignores_a_hangup_and_finishes(synthetic, tmp_path):
    """``nohup nas export ...``: the hangup the user asked to ignore stays ignored, and the export is written whole."""
    storage = f"sqlite:///{synthetic}"
    out = tmp_path / "m"
    finished = stopped_export(tmp_path, "writing", "SIGHUP", storage, out, hangup_ignored=True)
    assert finished.returncode == 0, finished.stderr
    assert finished.stderr.startswith(f"wrote '{out}' (") and finished.stderr.count("\n") == 1, finished.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"] and (out / "config.json").exists()


def test_a_refused_clash_removes_only_its_own_folder_beside_the_users_files_and_the_study(synthetic, tmp_path):
    """The clash refusal removes the hidden folder it had just written (``shutil.rmtree``): in a project folder that
    also holds the study being read, the user's notes and an older export holding a user's file named as one this
    export writes, every file stays byte for byte and nothing else is left."""
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "base.db").write_bytes(synthetic.read_bytes())
    (proj / "notes.txt").write_text("mine")
    storage = f"sqlite:///{proj / 'base.db'}"
    older = nas("export", "--storage", storage, "--rank", "baseline", "--format", "llama", "-o", str(proj / "m"))
    assert older.exit_code == 0, older.output
    (proj / "m" / "modeling_prism.py").write_text("# mine")  # the hf layout writes a file of this name
    before = tree(proj)
    refused = nas("export", "--storage", storage, "--rank", "baseline", "--format", "hf", "-o", str(proj / "m"),
                  "--force")
    assert refused.exit_code == 2 and "holds 'modeling_prism.py', which no export wrote there" in refused.stderr
    assert tree(proj) == before
    assert sorted(p.name for p in proj.iterdir()) == ["base.db", "m", "notes.txt"]
