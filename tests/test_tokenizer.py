"""The tokenizer and chat template rebuilt from SmolLM2's GGUF metadata, and incremental
detokenization of multi-byte characters."""

import pytest

from minivllm.engine.detokenizer import REPLACEMENT_CHAR, IncrementalDetokenizer
from minivllm.model.loader import default_model_path
from minivllm.tokenizer import Tokenizer

TEXTS = ["héllo wörld, naïve café", "東京タワー 🤗🚀 emoji", "a 👩‍👩‍👧 family", "x = 12345;\n\ty"]


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_path(default_model_path())


def test_special_tokens_are_single_ids(tok):
    assert tok.encode("<|im_start|>user<|im_end|>") == [1, 4093, 2]
    assert (tok.bos_token_id, tok.eos_token_id) == (1, 2)
    assert tok.decode([1, 4093, 2]) == "user"  # special tokens skipped
    assert tok.decode([1, 4093, 2], skip_special_tokens=False) == "<|im_start|>user<|im_end|>"


def test_known_ids_and_digits_split_one_by_one(tok):
    assert tok.encode("The capital of France is Paris.") == [504, 3575, 282, 4649, 314, 7042, 30]
    assert tok.convert_ids_to_tokens(tok.encode("2024")) == ["2", "0", "2", "4"]


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tok, text):
    assert tok.decode(tok.encode(text)) == text


def test_chat_template_from_gguf(tok):
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert text == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
                    "Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                    "<|im_start|>assistant\n")


@pytest.mark.parametrize("text", TEXTS)
def test_incremental_detokenization_never_splits_a_character(tok, text):
    ids = tok.encode(text)
    if "🤗" in text or "👩" in text:  # these characters really are split across tokens
        assert any(REPLACEMENT_CHAR in tok.decode([i]) for i in ids)
    detok = IncrementalDetokenizer(tok)
    pieces = []
    for i in ids:
        before = detok.output_text
        detok.update([i])
        pieces.append(detok.output_text[len(before):])
    assert "".join(pieces) == text
    assert not any(REPLACEMENT_CHAR in p for p in pieces)


def test_stop_string_across_tokens(tok):
    ids = tok.encode("The capital of France is Paris. Rome")
    detok = IncrementalDetokenizer(tok, stop=["is Par"])
    for hit, i in enumerate(ids):
        if stop := detok.update([i]):
            break
    assert stop == "is Par" and detok.output_text == "The capital of France "
    assert tok.decode(ids[:hit + 1]).endswith("Paris")  # found on the token that completed it


def test_a_stop_string_counts_only_once_it_ends_past_min_tokens(tok):
    """vLLM's rule (detokenizer.py:134-136): a stop string that ends within the text of the
    first min_tokens tokens is no stop; the next one that ends past it is."""
    ids = tok.encode("The cat. The dog. The end")
    first_end = len(tok.encode("The cat."))  # tokens up to the first "."
    for min_tokens, stops_after in ((0, "The cat"), (first_end, "The cat. The dog")):
        detok = IncrementalDetokenizer(tok, stop=["."], min_tokens=min_tokens)
        for i in ids:
            if stop := detok.update([i]):
                break
        assert stop == "." and detok.output_text == stops_after, (min_tokens, detok.output_text)


def _save_with_transformers(path):
    """The tiny model's folder with its tokenizer saved by transformers itself, as a checkpoint
    downloaded today is: transformers 5 puts the template in chat_template.jinja."""
    import os

    from tiny_model import CHAT_TEMPLATE, make_tiny_model_dir, tiny_tokenizer
    from transformers import PreTrainedTokenizerFast
    make_tiny_model_dir(path)
    os.remove(os.path.join(path, "tokenizer_config.json"))
    hf = PreTrainedTokenizerFast(tokenizer_object=tiny_tokenizer(), bos_token="<|im_start|>",
                                 eos_token="<|im_end|>")
    hf.chat_template = CHAT_TEMPLATE
    hf.save_pretrained(path)
    return hf


def test_chat_template_from_a_folder_saved_by_transformers(tmp_path):
    hf = _save_with_transformers(str(tmp_path))
    messages = [{"role": "user", "content": "hi"}]
    expected = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    tok = Tokenizer.from_path(str(tmp_path))
    assert tok.apply_chat_template(messages) == expected
    assert tok.eos_token_id == hf.eos_token_id


def test_chat_on_a_folder_saved_by_transformers(tmp_path):
    from minivllm import LLM
    from minivllm.sampling_params import SamplingParams
    _save_with_transformers(str(tmp_path))
    with LLM(str(tmp_path)) as llm:
        out = llm.chat([{"role": "user", "content": "hi"}],
                       SamplingParams(temperature=0.0, max_tokens=3), use_tqdm=False)[0]
    assert out.prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert len(out.outputs[0].token_ids) >= 1
