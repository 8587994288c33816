"""SFT and preference data in the formats TRL users have (jaxrl.data.chat, jaxrl.data.preferences):
rows checked with file:line errors, conversations rendered by real chat templates with the loss on
exactly the assistant turns (every one, or the last), lengths chosen from the data with cut rows
counted and refused past a fraction, and chat preference pairs that share their prompt tokens."""

import json
import os
import string

import numpy as np
import pytest

from jaxrl.config import ConfigError
from jaxrl.data import build_preference_dataset, load_preference_split, tokenize_sft
from jaxrl.data.chat import (
    ChatDataError,
    Encoded,
    check_cuts,
    check_length_settings,
    choose_length,
    encode_conversation,
    encode_sft_rows,
    example_lengths,
    fit_lengths,
    hold_out,
    pack,
    read_sft_jsonl,
    require_chat_template,
)
from jaxrl.data.preferences import (
    PreferenceDataError,
    encode_preference_rows,
    read_preference_jsonl,
    tokenize_preferences,
)
from jaxrl.lm.tokenizer import ByteTokenizer, load_tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATES = os.path.join(HERE, "fixtures", "chat_templates")
SPECIALS = ("<pad>", "<bos>", "<|im_start|>", "<|im_end|>", "<unk>")
CHARS = sorted(set(string.printable) - set("\x0b\x0c\r"))
CHATML = (
    "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def write_chat_tokenizer(directory, template=CHATML, merges=(), bos="<bos>") -> str:
    """A character-level tokenizer.json (printable ASCII, BPE with `merges`) whose ids fit the
    tiny model's 259-token vocabulary, with ChatML's <|im_start|> / <|im_end|> as special tokens
    (<|im_end|> the EOS, as in SmolLM2) and `template` as its chat template."""
    from tokenizers import Tokenizer, decoders, models

    os.makedirs(directory, exist_ok=True)
    tokens = [*SPECIALS, *CHARS] + ["".join(pair) for pair in merges]
    vocab = {token: i for i, token in enumerate(tokens)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=list(merges), unk_token="<unk>"))
    tokenizer.add_special_tokens(list(SPECIALS))
    tokenizer.decoder = decoders.Fuse()
    tokenizer.save(os.path.join(directory, "tokenizer.json"))
    config = {"eos_token": "<|im_end|>", "pad_token": "<pad>", "unk_token": "<unk>"}
    config |= {"bos_token": bos} if bos else {}
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump({**config, "chat_template": template}, f)
    return str(directory)


def chat_tokenizer(tmp_path, name="tok", **kwargs):
    return load_tokenizer(write_chat_tokenizer(tmp_path / name, **kwargs))


def text_of(tokenizer, ids) -> str:
    """The exact text of `ids`, special tokens included."""
    return "".join(tokenizer.token_text[i] for i in ids)


@pytest.fixture
def tok(tmp_path):
    tokenizer = chat_tokenizer(tmp_path)
    with open(tokenizer.source) as f:
        vocab = json.load(f)["model"]["vocab"]
    tokenizer.token_text = {i: token for token, i in vocab.items()}
    return tokenizer


def write_rows(path, rows) -> str:
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
    return str(path)


def message(role, content):
    return {"role": role, "content": content}


CONVERSATION = [
    message("system", "be brief"),
    message("user", "hi"),
    message("assistant", "a1"),
    message("user", "more"),
    message("assistant", "a2"),
]


def loss_texts(tokenizer, example: Encoded) -> list[str]:
    return [text_of(tokenizer, example.ids[start:end]) for start, end in example.spans]


# ---------------------------------------------------------------------------------------------
# Assistant turns


def test_messages_rows_train_every_assistant_turn_or_the_last(tok, tmp_path):
    path = write_rows(tmp_path / "train.jsonl", [{"messages": CONVERSATION, "id": 7}])
    rows = read_sft_jsonl(path)
    assert rows[0].conversational and rows[0].where == f"{path}:1"
    every = encode_sft_rows(rows, tok, "all")[0]
    # The whole conversation, tokenised as one text: what the model reads after training.
    assert every.ids == tok.encode(tok.apply_chat_template(CONVERSATION))
    # Each turn's text with its end-of-turn marker (the model must learn to stop).
    assert loss_texts(tok, every) == ["a1<|im_end|>\n", "a2<|im_end|>\n"]
    prompt = tok.apply_chat_template(CONVERSATION[:2], add_generation_prompt=True)
    assert every.ids[: every.prompt_length] == tok.encode(prompt)  # what generation starts from
    last = encode_sft_rows(rows, tok, "last")[0]
    assert last.ids == every.ids and loss_texts(tok, last) == ["a2<|im_end|>\n"]

    arrays = pack([every], tok, 64, 128)
    masked = arrays["tokens"][0][arrays["loss_mask"][0]]
    assert text_of(tok, masked) == "a1<|im_end|>\na2<|im_end|>\n"
    assert arrays["attention_mask"][0].sum() == len(every.ids)


def test_conversational_prompt_completion_trains_only_the_completion(tok, tmp_path):
    # A few-shot prompt holds an assistant message; only the completion is a target.
    row = {"prompt": CONVERSATION[:4], "completion": [message("assistant", "a2")]}
    rows = read_sft_jsonl(write_rows(tmp_path / "train.jsonl", [row]))
    for turns in ("all", "last"):
        (example,) = encode_sft_rows(rows, tok, turns)
        assert loss_texts(tok, example) == ["a2<|im_end|>\n"]
        assert example.ids == tok.encode(tok.apply_chat_template(CONVERSATION))


@pytest.mark.parametrize(
    "name, ends",
    [
        ("qwen25", ["a1<|im_end|>\n", "a2<|im_end|>\n"]),
        ("llama32", ["a1<|eot_id|>", "a2<|eot_id|>"]),
        ("chatml_smollm2", ["a1<|im_end|>\n", "a2<|im_end|>\n"]),
    ],
)
def test_assistant_turns_of_real_chat_templates(tmp_path, name, ends):
    with open(os.path.join(TEMPLATES, f"{name}.jinja"), encoding="utf-8") as f:
        template = f.read()
    tokenizer = chat_tokenizer(tmp_path, template=template)
    with open(tokenizer.source) as f:
        tokenizer.token_text = {i: t for t, i in json.load(f)["model"]["vocab"].items()}
    example = encode_conversation(tokenizer, CONVERSATION, [2, 4], "row")
    assert loss_texts(tokenizer, example) == ends


def test_a_token_straddling_a_turn_boundary_joins_the_loss(tmp_path):
    # Merges across the boundaries: ">o" joins the generation prompt's last character to the
    # reply's first, "k<" the reply's last to the next turn's first.
    template = (
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    tokenizer = chat_tokenizer(tmp_path, template=template, merges=[(">", "o"), ("k", "<")])
    with open(tokenizer.source) as f:
        tokenizer.token_text = {i: t for t, i in json.load(f)["model"]["vocab"].items()}
    conversation = [
        message("user", "hi"),
        message("assistant", "ok"),
        message("user", "bye"),
        message("assistant", "no"),
    ]
    example = encode_conversation(tokenizer, conversation, [1, 3], "row")
    assert example.ids == tokenizer.encode(tokenizer.apply_chat_template(conversation))
    assert loss_texts(tokenizer, example) == [">ok<", "no"]

    # A preference pair keeps its prompt's tokens; the reply is then tokenised on its own.
    row = {
        "prompt": conversation[:1],
        "chosen": [message("assistant", "ok")],
        "rejected": [message("assistant", "no")],
    }
    chosen, rejected = encode_preference_rows([row], tokenizer)
    prompt_ids = tokenizer.encode("<user>hi<assistant>")
    for example, reply in ((chosen[0], "ok"), (rejected[0], "no")):
        assert example.ids[: example.prompt_length] == prompt_ids
        assert example.ids[example.prompt_length :] == tokenizer.encode(reply)


def test_a_template_that_rewrites_earlier_turns_trains_the_last_only(tmp_path):
    # Earlier replies are elided once the conversation goes on (as templates dropping earlier
    # turns' reasoning do): they cannot be located, the last one can.
    template = (
        "{% for m in messages %}{% if m.role == 'assistant' and not loop.last %}<a>...\n"
        "{% else %}<{{ m.role }}>{{ m.content }}\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    tokenizer = chat_tokenizer(tmp_path, template=template)
    path = write_rows(tmp_path / "train.jsonl", [{"messages": CONVERSATION}])
    rows = read_sft_jsonl(path)
    with pytest.raises(ChatDataError, match=rf"^{path}:1: .*assistant message 2 .*'last'"):
        encode_sft_rows(rows, tokenizer, "all")
    (example,) = encode_sft_rows(rows, tokenizer, "last")
    assert len(example.spans) == 1


def test_a_template_refusing_a_conversation_names_the_row(tmp_path):
    template = "{{ raise_exception('Conversation roles must alternate user/assistant') }}"
    tokenizer = chat_tokenizer(tmp_path, template=template)
    path = write_rows(tmp_path / "train.jsonl", [{"messages": CONVERSATION}])
    with pytest.raises(ChatDataError, match=rf"^{path}:1: the chat template refused .*alternate"):
        encode_sft_rows(read_sft_jsonl(path), tokenizer)


def test_text_rows_pack_as_tokenize_sft(tmp_path):
    rows = [
        {"prompt": "rev 123=", "completion": "321"},
        {"prompt": "", "completion": "x"},
        {"prompt": "a long prompt that is cut", "completion": "a long completion, cut too"},
    ]
    parsed = read_sft_jsonl(write_rows(tmp_path / "train.jsonl", rows))
    assert not parsed[0].conversational
    tok = ByteTokenizer()
    for lengths in ((12, 20), (40, 80), (3, 9)):
        packed = pack(encode_sft_rows(parsed, tok), tok, *lengths)
        expected = tokenize_sft([r["prompt"] for r in rows], [r["completion"] for r in rows], tok,
                                *lengths)  # fmt: skip
        assert packed.keys() == expected.keys()
        for key in expected:
            np.testing.assert_array_equal(packed[key], expected[key])


def test_a_cut_conversation_keeps_bos_and_the_prompt_end(tok):
    example = encode_conversation(tok, CONVERSATION, [4], "row")
    assert example.ids[0] == tok.bos_id
    prompt_length, total = example.prompt_length, len(example.ids)
    assert total - prompt_length == 4  # a 2 <|im_end|> \n
    arrays = pack([example], tok, 10, 12)
    kept = [tok.bos_id, *example.ids[prompt_length - 9 : prompt_length]]
    assert arrays["prompt_tokens"][0].tolist() == kept
    # 2 positions remain for the reply: it is cut and loses its end-of-turn marker.
    assert arrays["tokens"][0].tolist() == kept + example.ids[prompt_length : prompt_length + 2]
    assert arrays["loss_mask"][0].tolist() == [False] * 10 + [True] * 2
    assert text_of(tok, arrays["tokens"][0][10:]) == "a2"
    prompt, rest = example_lengths([example])
    assert check_cuts(prompt, rest, 10, 12, max_cut_fraction=1.0) == 1


# ---------------------------------------------------------------------------------------------
# Rows


GOOD_TEXT = json.dumps({"prompt": "p", "completion": "c"})
GOOD_CHAT = json.dumps({"messages": CONVERSATION})


@pytest.mark.parametrize(
    "first, bad, problem",
    [
        (GOOD_TEXT, '{"prompt": "p", "completion": "c"', "invalid JSON"),
        (GOOD_TEXT, '["p", "c"]', "expected a JSON object"),
        (GOOD_TEXT, '{"prompt": "p"}', "missing field 'completion'"),
        (GOOD_TEXT, '{"text": "p c"}', "missing field 'prompt'"),
        (GOOD_TEXT, '{"prompt": "p", "completion": 3}', "'completion' a int"),
        (GOOD_TEXT, '{"prompt": [], "completion": "c"}', "give two strings, or two lists"),
        (GOOD_TEXT, '{"prompt": "p", "completion": "  "}', "'completion' is empty"),
        (GOOD_TEXT, GOOD_CHAT, "a messages row in a file whose first row"),
        (GOOD_CHAT, '{"messages": []}', "'messages' is an empty list"),
        (GOOD_CHAT, '{"messages": "hi"}', "'messages' must be a list of chat messages"),
        (GOOD_CHAT, '{"messages": ["hi"]}', "message 0 is a str, not an object"),
        (GOOD_CHAT, '{"messages": [{"role": "human", "content": "x"}]}', "role 'human'"),
        (GOOD_CHAT, '{"messages": [{"role": "user"}]}', "has no 'content'"),
        (GOOD_CHAT, '{"messages": [{"role": "user", "content": 1}]}', "(user): 'content' is int"),
        (GOOD_CHAT, '{"messages": [{"role": "user", "content": "x"}]}', "no assistant turn"),
        (
            GOOD_CHAT,
            '{"prompt": [{"role": "user", "content": "x"}], "completion": '
            '[{"role": "user", "content": "y"}]}',
            "'completion' has no assistant message",
        ),
    ],
)
def test_bad_sft_rows_name_file_and_line(tmp_path, first, bad, problem):
    # Line 1 good, line 2 blank (still counted), line 3 bad.
    path = tmp_path / "train.jsonl"
    path.write_text(f"{first}\n\n{bad}\n{first}\n", encoding="utf-8")
    with pytest.raises(ChatDataError) as error:
        read_sft_jsonl(path)
    message_ = str(error.value)
    assert message_.startswith(f"{path}:3: ") and problem in message_, message_
    assert "\n" not in message_ and "; " in message_


def test_bad_sft_files(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(GOOD_TEXT.encode() + b"\n" + b'{"prompt": "\xff"}\n')
    with pytest.raises(ChatDataError, match=f"^{bad}:2: not valid UTF-8"):
        read_sft_jsonl(bad)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(ChatDataError, match=f"^{empty}: no rows"):
        read_sft_jsonl(empty)
    with pytest.raises(ChatDataError, match="no such file"):
        read_sft_jsonl(tmp_path / "missing.jsonl")


def test_chat_rows_need_a_chat_template(tmp_path):
    expected = r"^train_jsonl: x.jsonl holds chat messages but the tokenizer \(the byte tokenizer\)"
    with pytest.raises(ConfigError, match=expected + " has no chat template"):
        require_chat_template(ByteTokenizer(), "train_jsonl", "x.jsonl")
    directory = write_chat_tokenizer(tmp_path / "plain")
    os.remove(os.path.join(directory, "tokenizer_config.json"))
    plain = load_tokenizer(directory)
    with pytest.raises(
        ConfigError, match=r"^eval_jsonl: .*has no chat template to render them; start from"
    ):
        require_chat_template(plain, "eval_jsonl", "x.jsonl")
    require_chat_template(chat_tokenizer(tmp_path), "train_jsonl", "x.jsonl")


def test_hold_out_is_deterministic_disjoint_and_checked():
    rows = list(range(20))
    train, held = hold_out(rows, 5, seed=3)
    assert len(held) == 5 and sorted(train + held) == rows
    assert train == sorted(train) and held == sorted(held)  # file order kept
    assert hold_out(rows, 5, seed=3) == (train, held)
    assert hold_out(rows, 5, seed=4)[1] != held
    for too_many in (20, 256):
        with pytest.raises(ConfigError, match=rf"^num_eval: {too_many} held-out rows out of 20 "):
            hold_out(rows, too_many, seed=0)
    with pytest.raises(ConfigError, match="nothing to evaluate on"):
        hold_out(rows, 0, seed=0)


# ---------------------------------------------------------------------------------------------
# Lengths


def test_choose_length_is_a_percentile_of_the_rows():
    lengths = [3, 9, 4, 100, 5, 6, 7, 8, 5, 4]
    assert choose_length(lengths, 100) == 100
    assert choose_length(lengths, 90) == 9  # the long tail's one row is cut
    assert choose_length(lengths, 50) in lengths
    for bad in (0, -1, 101):
        with pytest.raises(ConfigError, match="^length_percentile: "):
            choose_length(lengths, bad)


def test_fit_lengths_from_the_data_or_as_given():
    prompt, rest = np.array([4, 10, 6]), np.array([5, 2, 20])
    assert fit_lengths(prompt, rest, 0, 0) == (10, 26)  # the longest prompt; the longest row
    assert fit_lengths(prompt, rest, 8, 0) == (8, 26)
    assert fit_lengths(prompt, rest, 5, 0) == (5, 25)  # prompts are cut to 5 first
    assert fit_lengths(prompt, rest, 0, 12) == (10, 12)
    assert fit_lengths(prompt, rest, 0, 8) == (7, 8)  # room for a response
    assert fit_lengths(np.array([30]), np.array([1]), 0, 0) == (30, 31)
    assert fit_lengths(np.array([2]), np.array([3]), 40, 0) == (40, 41)  # room for a reply
    check_length_settings(0, 0, 100.0, 0.05)
    for args, field in [
        ((-1, 0, 100.0, 0.0), "max_prompt_length"),
        ((8, 8, 100.0, 0.0), "max_length"),
        ((0, 0, 0.0, 0.0), "length_percentile"),
        ((0, 0, 100.0, 1.5), "max_cut_fraction"),
    ]:
        with pytest.raises(ConfigError, match=f"^{field}: "):
            check_length_settings(*args)


def test_cut_rows_are_counted_and_too_many_refused():
    prompt = np.array([4] * 18 + [30, 40])
    rest = np.array([5] * 18 + [5, 5])
    assert check_cuts(prompt, rest, 40, 45, 0.0) == 0
    assert check_cuts(prompt, rest, 30, 45, 0.05) == 1  # 1 of 20 = 5%: allowed
    with pytest.raises(ConfigError) as error:
        check_cuts(prompt, rest, 16, 45, 0.05, rows="training rows")
    assert str(error.value).startswith(
        "max_prompt_length: 2 of 20 training rows (10.0%) would be cut at max_prompt_length=16, "
        "max_length=45, more than max_cut_fraction=0.05; set max_prompt_length=40 to fit every "
        "prompt (or 30 to cut at most max_cut_fraction of them)"
    )
    # The sequence limit, with the prompts as cut (40 -> 36), or whole where the prompt length
    # came from the data (it follows max_length).
    with pytest.raises(ConfigError, match=r"^max_length: 2 of 20 .*; set max_length=41 to fit"):
        check_cuts(prompt, rest, 36, 20, 0.05)
    with pytest.raises(ConfigError, match=r"^max_length: 20 of 20 .*; set max_length=45 to fit"):
        check_cuts(prompt, rest, 2, 3, 0.05, given=(False, True))
    # Both lengths from the data: the percentile cut them.
    with pytest.raises(ConfigError, match=r"^length_percentile: 2 of 20 .*; raise length_perc"):
        check_cuts(prompt, rest, 4, 9, 0.05, given=(False, False))


# ---------------------------------------------------------------------------------------------
# Preference pairs in chat messages


CHAT_PAIR = {
    "prompt": [message("system", "be brief"), message("user", "hi")],
    "chosen": [message("assistant", "hello")],
    "rejected": [message("assistant", "go away")],
}


def test_chat_pairs_share_the_generation_prompt(tok, tmp_path):
    text_pair = {"prompt": "hi", "chosen": "hello", "rejected": "go away"}
    chosen, rejected = encode_preference_rows([CHAT_PAIR, text_pair], tok)
    prompt = tok.encode(tok.apply_chat_template(CHAT_PAIR["prompt"], add_generation_prompt=True))
    for example, reply in ((chosen[0], "hello"), (rejected[0], "go away")):
        assert example.ids[: example.prompt_length] == prompt  # no BOS or EOS added: the template's
        assert loss_texts(tok, example) == [f"{reply}<|im_end|>\n"]
    # A string pair: BOS + prompt, the reply and EOS in the loss.
    assert chosen[1].ids == [tok.bos_id, *tok.encode("hi"), *tok.encode("hello"), tok.eos_id]

    arrays = tokenize_preferences([CHAT_PAIR] * 2, tok, 64, 80)
    assert arrays["prompt_tokens"][0][arrays["prompt_mask"][0]].tolist() == prompt
    for side, reply in (("chosen", "hello"), ("rejected", "go away")):
        masked = arrays[f"{side}_tokens"][0][arrays[f"{side}_loss_mask"][0]]
        assert text_of(tok, masked) == f"{reply}<|im_end|>\n"

    # The file -> tensorflow-datasets -> rows round trip keeps the messages.
    path = write_rows(tmp_path / "pairs.jsonl", [CHAT_PAIR, {**CHAT_PAIR, "score": 1}])
    assert list(read_preference_jsonl(path)) == [CHAT_PAIR, CHAT_PAIR]
    built = build_preference_dataset({"train": path}, tmp_path / "data")
    assert list(load_preference_split(built, "train")) == [CHAT_PAIR, CHAT_PAIR]


@pytest.mark.parametrize(
    "bad, problem",
    [
        ({**CHAT_PAIR, "chosen": "hello"}, "fields mix strings and message lists"),
        ({**CHAT_PAIR, "rejected": [message("user", "x")]}, "'rejected' has no assistant"),
        ({**CHAT_PAIR, "prompt": [message("bot", "x")]}, "role 'bot'"),
        ({**CHAT_PAIR, "prompt": []}, "'prompt' is an empty list"),
        (
            {**CHAT_PAIR, "chosen": [{"role": "assistant", "content": None}]},
            "'content' is NoneType",
        ),
        ({"prompt": "p", "chosen": "c", "rejected": "r"}, "a string row in a file whose first"),
    ],
)
def test_bad_chat_pairs_name_file_and_line(tmp_path, bad, problem):
    path = write_rows(tmp_path / "pairs.jsonl", [CHAT_PAIR, "", bad])
    with pytest.raises(PreferenceDataError) as error:
        list(read_preference_jsonl(path))
    assert str(error.value).startswith(f"{path}:3: ") and problem in str(error.value)
    assert isinstance(error.value, ChatDataError)  # scripts catch both formats' errors alike
