"""Chat templates render byte for byte as transformers renders them (references made offline by
`tests/fixtures/make_hf_fixtures.py` with `AutoTokenizer.apply_chat_template(tokenize=False)`),
are found where checkpoints keep them, and run in transformers' sandboxed Jinja environment."""

import datetime
import json
import os
import shutil

import jinja2
import pytest

from jaxrl.config import ConfigError
from jaxrl.lm.tokenizer import HFTokenizer, load_chat_template, load_tokenizer, render_chat_template

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
TEMPLATES = os.path.join(HERE, "chat_templates")
TOKENIZER_JSON = os.path.join(HERE, "hf", "tokenizer", "tokenizer.json")

with open(os.path.join(TEMPLATES, "reference.json"), encoding="utf-8") as _f:
    REFERENCE = json.load(_f)


def template_text(name):
    with open(os.path.join(TEMPLATES, f"{name}.jinja"), encoding="utf-8") as f:
        return f.read()


def checkpoint_dir(directory, chat_template, tokens):
    """A tokenizer directory as the fixture script built it: tokenizer.json plus a
    tokenizer_config.json holding the template and the family's special tokens."""
    os.makedirs(directory, exist_ok=True)
    shutil.copyfile(TOKENIZER_JSON, os.path.join(directory, "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": chat_template,
        **tokens,
    }
    with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False)
    return directory


def named_templates():
    return [
        {"name": name, "template": template_text(file)}
        for name, file in REFERENCE["named_templates"].items()
    ]


def case_id(case):
    prompt = "+prompt" if case["add_generation_prompt"] else ""
    return f"{case['template']}-{case['conversation']}{prompt}"


def case_inputs(case):
    messages = REFERENCE["conversations"][case["conversation"]]
    return messages, (REFERENCE["tools"] if case["tools"] else None)


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    """The HFTokenizer of each reference directory (the three templates and the named list)."""
    root = tmp_path_factory.mktemp("chat")
    out = {}
    for name, tokens in REFERENCE["tokenizer_config_tokens"].items():
        out[name] = load_tokenizer(checkpoint_dir(root / name, template_text(name), tokens))
    named_tokens = REFERENCE["tokenizer_config_tokens"]["qwen25"]
    out["named"] = load_tokenizer(checkpoint_dir(root / "named", named_templates(), named_tokens))
    return out


def test_reference_covers_the_brief():
    cases = REFERENCE["cases"]
    assert {c["template"] for c in cases} == {"chatml_smollm2", "llama32", "qwen25", "named"}
    assert len(REFERENCE["conversations"]) >= 5
    assert {c["add_generation_prompt"] for c in cases} == {False, True}
    assert any(m["role"] == "system" for m in REFERENCE["conversations"]["system_multi_turn"])


@pytest.mark.parametrize("case", REFERENCE["cases"], ids=case_id)
def test_apply_chat_template_matches_transformers(tokenizers, case):
    messages, tools = case_inputs(case)
    rendered = tokenizers[case["template"]].apply_chat_template(
        messages, case["add_generation_prompt"], tools=tools, **REFERENCE["template_kwargs"]
    )
    assert rendered == case["rendered"]


@pytest.mark.parametrize(
    "case", [c for c in REFERENCE["cases"] if c["template"] != "named"], ids=case_id
)
def test_render_chat_template_matches_transformers(case):
    """The plain function, given the template text and the special tokens itself."""
    messages, tools = case_inputs(case)
    tokens = REFERENCE["special_tokens_map"][case["template"]]
    rendered = render_chat_template(
        template_text(case["template"]),
        messages,
        add_generation_prompt=case["add_generation_prompt"],
        tools=tools,
        **tokens,
        **REFERENCE["template_kwargs"],
    )
    assert rendered == case["rendered"]


def test_special_tokens_are_transformers_special_tokens_map(tokenizers):
    for name, expected in REFERENCE["special_tokens_map"].items():
        assert tokenizers[name].special_tokens == expected, name


def test_templates_are_found_where_checkpoints_keep_them(tmp_path, tokenizers):
    qwen = template_text("qwen25")
    assert tokenizers["qwen25"].chat_template == qwen
    assert tokenizers["named"].chat_template == {
        t["name"]: t["template"] for t in named_templates()
    }

    # chat_template.jinja (transformers >= 4.43) takes precedence over tokenizer_config.json.
    directory = checkpoint_dir(tmp_path / "file", template_text("llama32"), {"eos_token": "<eos>"})
    with open(directory / "chat_template.jinja", "w", encoding="utf-8") as f:
        f.write(qwen)
    assert load_chat_template(directory) == qwen
    os.makedirs(directory / "additional_chat_templates")
    with open(directory / "additional_chat_templates" / "rag.jinja", "w") as f:
        f.write("{{ documents | length }}")
    assert load_chat_template(directory) == {"default": qwen, "rag": "{{ documents | length }}"}
    tokenizer = load_tokenizer(directory)
    messages = [{"role": "user", "content": "hi"}]
    assert tokenizer.apply_chat_template(messages, chat_template="rag", documents=[{}] * 3) == "3"

    # An explicit template replaces the checkpoint's.
    tokenizer = load_tokenizer(directory, chat_template="{{ messages[0].content }}!")
    assert tokenizer.apply_chat_template(messages) == "hi!"


def test_named_templates_without_default_need_a_choice(tmp_path):
    templates = [{"name": "tool_use", "template": "{{ tools | length }}"}]
    tokenizer = load_tokenizer(checkpoint_dir(tmp_path, templates, {"eos_token": "<eos>"}))
    messages = [{"role": "user", "content": "hi"}]
    assert tokenizer.apply_chat_template(messages, tools=[{}, {}]) == "2"
    with pytest.raises(ConfigError, match=r"chat_template: .*named chat templates \(tool_use\)"):
        tokenizer.apply_chat_template(messages)


def test_missing_template_says_how_to_fix(tmp_path):
    shutil.copyfile(TOKENIZER_JSON, tmp_path / "tokenizer.json")
    tokenizer = load_tokenizer(tmp_path)
    assert isinstance(tokenizer, HFTokenizer) and tokenizer.chat_template is None
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(ConfigError) as error:
        tokenizer.apply_chat_template(messages)
    message = str(error.value)
    assert "\n" not in message
    assert "has no chat template" in message and "chat_template=" in message
    assert str(tmp_path / "tokenizer.json") in message
    # Passing one is the fix; without tokenizer_config.json, BOS/EOS are the chosen tokens.
    template = "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"
    assert tokenizer.apply_chat_template(messages, chat_template=template) == "<bos>hi<eos>"


def test_malformed_template_entry_is_refused(tmp_path):
    checkpoint_dir(tmp_path, [{"name": "default"}], {"eos_token": "<eos>"})
    with pytest.raises(ValueError, match="tokenizer_config.json: chat_template"):
        load_tokenizer(tmp_path)


# --- the environment -----------------------------------------------------------------------------

USER = [{"role": "user", "content": "hi"}]


def test_environment_matches_transformers():
    def render(template, **kwargs):
        return render_chat_template(template, USER, **kwargs)

    # trim_blocks and lstrip_blocks: block tags leave no newline or indentation behind.
    assert render("  {% if true %}\nA\n  {% endif %}\nB") == "A\nB"
    # tojson neither HTML-escapes nor ASCII-escapes, and takes json.dumps' options.
    assert render("{{ x | tojson }}", x="<&>'é") == '"<&>\'é"'
    assert render("{{ x | tojson(indent=2) }}", x={"a": [1]}) == '{\n  "a": [\n    1\n  ]\n}'
    assert render("{{ strftime_now('%Y') }}") == str(datetime.datetime.now().year)
    assert render("{% generation %}A{% endgeneration %}B") == "AB"
    assert (
        render("{% for i in range(5) %}{% if i == 2 %}{% break %}{% endif %}{{ i }}{% endfor %}")
        == "01"
    )
    ns = "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}"
    assert render(ns + "{{ ns.n }}") == "1"
    assert render("{{ dict(a=1) | tojson }}") == '{"a": 1}'
    # Keys whose value is None are dropped, as transformers does (templates test presence).
    message = [{"role": "user", "content": "hi", "tool_calls": None}]
    assert render_chat_template("{{ 'tool_calls' in messages[0] }}", message) == "False"
    # Reasoning is offered under the names templates read.
    message = [{"role": "assistant", "content": "4", "reasoning": "2+2"}]
    assert render_chat_template("{{ messages[0].reasoning_content }}", message) == "2+2"
    assert render("{{ add_generation_prompt }}", add_generation_prompt=True) == "True"
    assert render("{{ tools is none }}") == "True"


def test_raise_exception_and_the_sandbox():
    with pytest.raises(jinja2.exceptions.TemplateError, match="roles must alternate"):
        render_chat_template("{{ raise_exception('roles must alternate') }}", USER)
    with pytest.raises(jinja2.exceptions.SecurityError):
        render_chat_template("{{ ''.__class__.__mro__ }}", USER)
    with pytest.raises(jinja2.exceptions.SecurityError):  # immutable: no mutating methods
        render_chat_template("{{ messages.append(1) }}", USER)
    with pytest.raises(jinja2.exceptions.SecurityError, match="underscore"):
        render_chat_template("{% set ns = namespace(_x=1) %}", USER)


def test_bad_conversations_are_refused():
    with pytest.raises(ValueError, match="empty"):
        render_chat_template("x", [])
    with pytest.raises(TypeError, match=r"messages\[1\]"):
        render_chat_template("x", [{"role": "user", "content": "a"}, "b"])
    with pytest.raises(TypeError, match="messages: expected a list"):
        render_chat_template("x", {"role": "user", "content": "a"})
    with pytest.raises(TypeError, match="JSON-like"):
        render_chat_template("x", [{"role": "user", "content": object()}])
