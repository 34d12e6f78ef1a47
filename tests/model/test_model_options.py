"""model_options and rollout options for real models: chat templates, trust_remote_code,
gradient checkpointing, attention kernels."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from harness.config import ConfigError, build_run_config, load_run_config
from harness.model.build import ModelOptions, load_model_and_tokenizer
from harness.model.logprobs import forward_logprobs
from harness.model.lora import prepare_for_training
from harness.model.prompting import apply_chat_template, resolve_chat_template
from harness.run.loop import run
from harness.sampling.base import encode_prompts
from harness.sampling.local import sample

TEMPLATE = (
    "{% for m in messages %}<bos>[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant] {% endif %}"
)


@pytest.fixture
def templated_dir(hf_dirs, tmp_path):
    """The Qwen2 directory with a chat template in its tokenizer config."""
    path = tmp_path / "qwen2-chat"
    shutil.copytree(hf_dirs["qwen2"], path)
    _, tok = load_model_and_tokenizer(str(path))
    tok.chat_template = TEMPLATE
    tok.save_pretrained(path)
    return path


def test_chat_template_auto_none_and_path(templated_dir, hf_dirs, tmp_path):
    _, tok = load_model_and_tokenizer(str(templated_dir))
    assert resolve_chat_template("none", tok) is None
    assert resolve_chat_template("auto", tok) == TEMPLATE
    _, plain = load_model_and_tokenizer(str(hf_dirs["qwen2"]))
    assert resolve_chat_template("auto", plain) is None  # no template: prompts stay as they are
    f = tmp_path / "t.jinja"
    f.write_text("{{ messages[0]['content'] }}!")
    assert resolve_chat_template(str(f), tok) == "{{ messages[0]['content'] }}!"
    assert apply_chat_template(tok, ["rev 12="], TEMPLATE) == ["<bos>[user] rev 12=\n[assistant] "]
    enc = encode_prompts(tok, ["rev 12="], None, TEMPLATE)
    ids = enc["input_ids"][0].tolist()
    assert ids.count(tok.bos_token_id) == 1 and ids[0] == tok.bos_token_id  # no second BOS
    assert tok.decode(ids) == "<bos>[user] rev 12=\n[assistant] "


def test_chat_template_run_and_bad_path(templated_dir, tmp_path):
    base = {
        "steps": 2,
        "model": str(templated_dir),
        "rollout": {"prompts_per_step": 2, "n_samples": 2, "max_new_tokens": 4},
        "eval": {"every": 0, "n_prompts": 2},
        "warm_start": {"steps": 1, "batch_size": 2},
        "threads": 1,
    }
    keys = {}
    for spec in ("auto", "none"):
        c = build_run_config(base, {"rollout.chat_template": spec})
        res = run(c, results_dir=tmp_path)
        assert res.status == "completed", res.reason
        keys[spec] = res.tags["warm_start.cache_key"]
    assert keys["auto"] != keys["none"]  # the warm start trained on the templated prompts
    with pytest.raises(ConfigError, match="chat_template") as err:
        build_run_config(base, {"rollout.chat_template": str(tmp_path / "missing.jinja")})
    assert "\n" not in str(err.value)
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for %}")
    with pytest.raises(ConfigError, match="chat_template"):
        load_run_config(None, [f"model={templated_dir}", f"rollout.chat_template={bad}"])


def test_remote_code_is_refused_unless_trusted(hf_dirs, tmp_path):
    path = tmp_path / "custom"
    shutil.copytree(hf_dirs["qwen2"], path)
    cfg = json.loads((path / "config.json").read_text())
    cfg["auto_map"] = {"AutoConfig": "configuration_x.XConfig"}
    cfg["model_type"] = "x-custom"
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="trust_remote_code") as err:
        load_run_config(None, [f"model={path}"])
    assert "\n" not in str(err.value)
    assert build_run_config({}).model_options.trust_remote_code is False


def test_gradient_checkpointing_gives_the_same_gradients(hf_dirs):
    grads = []
    for gc in (False, True):
        model, tok = load_model_and_tokenizer(str(hf_dirs["gpt_neox"]))
        model = prepare_for_training(model, ModelOptions(gradient_checkpointing=gc))
        flag = getattr(model, "is_activation_checkpointing", None)
        if flag is None:
            flag = model.is_gradient_checkpointing
        assert flag == gc
        model.train()  # checkpointing is active in train mode only; dropout is zeroed
        enc = tok(["rev 12=21", "add 1+2=3"], padding=True, return_tensors="pt")
        lp, _ = forward_logprobs(model, enc["input_ids"], enc["attention_mask"])
        (lp * enc["attention_mask"]).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert torch.allclose(grads[0], grads[1], atol=1e-6)
    assert grads[0].abs().sum() > 0


def test_eager_and_sdpa_kernels_agree(hf_dirs):
    out = []
    for attn in ("sdpa", "eager"):
        model, tok = load_model_and_tokenizer(
            str(hf_dirs["phi"]), options=ModelOptions(attn_implementation=attn)
        )
        assert model.config._attn_implementation == attn
        gen = torch.Generator().manual_seed(0)
        rb = sample(
            model, tok, ["rev 1=", "rev 123456="], n_samples=2, max_new_tokens=5, generator=gen
        )
        out.append(rb)
    assert torch.equal(out[0].input_ids, out[1].input_ids)
    assert torch.allclose(out[0].logprobs, out[1].logprobs, atol=1e-5)
    with pytest.raises(ConfigError, match="attn_implementation"):
        build_run_config({"model_options": {"attn_implementation": "flash"}})
