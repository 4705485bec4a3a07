"""Small Hugging Face checkpoints with random weights and a tokenizer trained
offline (the `tokenizers` library), saved to a directory: what the vLLM tests
and bench/serve.py serve.  Nothing is downloaded."""
import torch

CORPUS = ["the quick brown fox jumps over the lazy dog %d times" % i for i in range(200)] + [
    "serving language models on accelerators is fun", "hello world, how are you today?",
    "once upon a time there was a compiler that liked programs",
]
# A plain chat template, so /v1/chat/completions has one to apply.
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")


def make_checkpoint(path, arch="llama", dtype=torch.float32, vocab=384, hidden=128, layers=2, heads=4,
                    kv_heads=2, head_dim=32, intermediate=256, max_positions=512, seed=0, model_vocab=None):
    """model_vocab: the model's vocabulary when larger than the tokenizer's
    (a benchmark's model of a real size; its token ids past the tokenizer's
    are generated but not detokenized)."""
    import transformers as T
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = T.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(path)
    common = dict(vocab_size=max(len(fast), model_vocab or 0), hidden_size=hidden, intermediate_size=intermediate,
                  num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                  head_dim=head_dim, max_position_embeddings=max_positions, bos_token_id=1, eos_token_id=2,
                  tie_word_embeddings=False)
    torch.manual_seed(seed)
    if arch == "llama":
        model = T.LlamaForCausalLM(T.LlamaConfig(**common))
    elif arch == "qwen3":
        model = T.Qwen3ForCausalLM(T.Qwen3Config(**common))
    else:
        raise ValueError(f"unknown arch {arch!r}")
    model.to(dtype).save_pretrained(path)
    return path


def hf_greedy(path, prompt_ids, max_tokens, dtype=torch.float32):
    """Greedy continuations by Hugging Face generate() on the CPU (ending at
    the end-of-sequence token, included, as vLLM's do)."""
    import transformers as T

    model = T.AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    out = []
    with torch.no_grad():
        for ids in prompt_ids:
            x = torch.tensor([ids])
            y = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_tokens, do_sample=False,
                               pad_token_id=0)
            out.append(y[0, len(ids):].tolist())
    return out
