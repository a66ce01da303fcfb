"""Tokenizers: a small deterministic built-in one, and loading/saving checkpoint tokenizers.

Real π0.5 checkpoints use the PaliGemma SentencePiece tokenizer (257152 pieces). No such file
exists on the development machines, so random-weight checkpoints (presets ``pi05-small`` /
``pi05-tiny``) ship a tokenizer built here: a real SentencePiece-style BPE with the same
conventions as Gemma's (``<pad>``=0, ``<eos>``=1, ``<bos>``=2, ``<unk>``=3, "▁" for spaces with no
dummy prefix, 256 ``<0xNN>`` byte-fallback pieces, decoder ``▁``→space + byte fallback), trained by
our own deterministic BPE routine on the small English robotics corpus below and padded with
``<unused{i}>`` pieces to exactly the configured vocabulary size.

Determinism: merges are learned in pure Python with a total order on ties (higher count first,
then the lexicographically smaller pair), so the same ``vocab_size`` gives the same ids on every run
and machine (the test compares two ``tokenizer.json`` files byte for byte).
"""

from __future__ import annotations

import heapq
import os
import shutil
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import AutoTokenizer, GemmaTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from .untrusted import CheckpointError, inside, read_json, short

SPECIAL_TOKENS: tuple[str, ...] = ("<pad>", "<eos>", "<bos>", "<unk>")  # ids 0..3, as in Gemma
BYTE_TOKENS: tuple[str, ...] = tuple(f"<0x{b:02X}>" for b in range(256))
SPIECE_UNDERLINE = "\u2581"  # "▁"

_INSTRUCTIONS = """\
pick up the red cube and place it in the bowl
pick up the blue block and put it on the plate
put the green cup on the shelf
open the top drawer of the cabinet
close the drawer
push the button on the left
turn on the stove
turn off the light
put the bowl on the stove
put the cream cheese in the bowl
put both the alphabet soup and the tomato sauce in the basket
stack the yellow block on top of the red block
fold the towel in half
pour the water into the glass
wipe the table with the sponge
hand me the screwdriver
move the robot arm to the home position
grasp the handle and pull the door open
insert the peg into the hole
place the mug to the right of the plate
put the spoon in the drawer and close it
pick up the bottle from the table
transfer the cube from the left gripper to the right gripper
clean up the kitchen counter
put the apple in the basket
sort the objects by color
lift the box slowly
rotate the knob clockwise
slide the tray to the left
take the lid off the pot
put the fork next to the knife
bring the cup to the person
move forward and stop near the table
look at the camera
""".splitlines()

_CONVERSATION = """\
Hello, how can I help you today?
I am a robot. I can see the table, a red cube, a blue bowl and a green cup.
What do you see? I see a kitchen with a stove, a sink and a drawer.
The gripper is open. The gripper is closed. The arm is moving.
I have picked up the cube. Now I will place it in the bowl.
Yes, I can do that. No, I cannot reach the object. Please move it closer.
The task is done. The task failed, I will try again.
Subtask: reach the object. Subtask: grasp the object. Subtask: lift the object.
Subtask: move to the target. Subtask: release the object. Subtask: return home.
Memory: the cube was on the left side of the table. The bowl is on the right.
Thank you! You are welcome. Is there anything else?
Where is the cup? The cup is behind the plate, next to the bottle.
Which object should I pick first? Pick the small one, then the large one.
There are 3 objects: 1 cube, 1 bowl and 1 cup. The time is 12:30.
""".splitlines()


def _state_line(i: int, n: int = 14) -> str:
    # Deterministic pseudo-random bins 0..255 (no RNG: identical on every numpy/python version).
    return " ".join(str((i * 37 + k * 101 + k * k * 7) % 256) for k in range(n))


def corpus() -> list[str]:
    """The built-in training corpus (lines of English robotics text, prompts and numbers)."""
    lines = list(_INSTRUCTIONS) + list(_CONVERSATION)
    lines += [f"Task: {ins}, State: {_state_line(i)};\nAction: " for i, ins in enumerate(_INSTRUCTIONS)]
    lines += [" ".join(str(v) for v in range(s, 256, 16)) for s in range(16)]  # digits 0..255
    return lines


def _base_pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    # Spaces -> "▁" attached to the following word, no dummy prefix (Gemma: add_dummy_prefix=False).
    return pre_tokenizers.Metaspace(replacement=SPIECE_UNDERLINE, prepend_scheme="never", split=True)


def _learn_merges(word_counts: dict[str, int], max_merges: int) -> list[tuple[str, str]]:
    """Greedy BPE over pre-tokenized words; ties broken by the smaller (left, right) string pair."""
    words = sorted(word_counts)
    syms = [list(w) for w in words]
    freq = [word_counts[w] for w in words]
    pair_count: Counter[tuple[str, str]] = Counter()
    where: dict[tuple[str, str], set[int]] = defaultdict(set)
    for i, s in enumerate(syms):
        for p in zip(s, s[1:]):
            pair_count[p] += freq[i]
            where[p].add(i)
    heap = [(-c, p) for p, c in pair_count.items()]
    heapq.heapify(heap)
    merges: list[tuple[str, str]] = []
    while heap and len(merges) < max_merges:
        neg, pair = heapq.heappop(heap)
        if pair_count.get(pair, 0) != -neg:
            continue  # stale heap entry
        if -neg < 2:
            break  # only merge pairs that repeat
        merges.append(pair)
        merged = pair[0] + pair[1]
        changed: set[tuple[str, str]] = set()
        for i in sorted(where.pop(pair, set())):
            old = syms[i]
            for p in zip(old, old[1:]):
                pair_count[p] -= freq[i]
                changed.add(p)
            new: list[str] = []
            j = 0
            while j < len(old):
                if j + 1 < len(old) and old[j] == pair[0] and old[j + 1] == pair[1]:
                    new.append(merged)
                    j += 2
                else:
                    new.append(old[j])
                    j += 1
            syms[i] = new
            for p in zip(new, new[1:]):
                pair_count[p] += freq[i]
                where[p].add(i)
                changed.add(p)
        pair_count.pop(pair, None)
        for p in sorted(changed - {pair}):
            if pair_count.get(p, 0) > 0:
                heapq.heappush(heap, (-pair_count[p], p))
            else:
                pair_count.pop(p, None)
    return merges


def build_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """Build the built-in SentencePiece-style BPE tokenizer with exactly ``vocab_size`` entries.

    Layout: ids 0..3 ``<pad> <eos> <bos> <unk>``; 4..259 the byte pieces ``<0x00>..<0xFF>``;
    then single characters (printable ASCII, ``▁``, ``\\n``, ``\\t`` and any corpus character, sorted by
    code point); then learned merges in order; then ``<unused{i}>`` (special) up to ``vocab_size``.
    Encoding with ``add_special_tokens=True`` prepends ``<bos>`` (as Gemma's tokenizer does).
    Characters outside the vocabulary are encoded as their UTF-8 bytes (byte fallback), so
    ``decode(encode(text)) == text`` for any text without ``▁`` (U+2581, which decodes to a space,
    exactly as in SentencePiece).

    Args:
        vocab_size: total number of ids (e.g. 512 for ``pi05-tiny``, 2048 for ``pi05-small``).

    Raises:
        ValueError: ``vocab_size`` is smaller than specials + bytes + characters (the message
            gives the minimum).
    """
    pre_tok = _base_pre_tokenizer()
    word_counts: Counter[str] = Counter()
    for line in corpus():
        word_counts.update(w for w, _ in pre_tok.pre_tokenize_str(line))
    chars = {chr(c) for c in range(0x21, 0x7F)} | {SPIECE_UNDERLINE, "\n", "\t"}
    chars |= {ch for w in word_counts for ch in w}
    alphabet = sorted(chars)
    base = list(SPECIAL_TOKENS) + list(BYTE_TOKENS) + alphabet
    if not isinstance(vocab_size, int) or vocab_size < len(base):
        raise ValueError(
            f"vocab_size={vocab_size!r} is too small for the built-in tokenizer: it needs at least "
            f"{len(base)} ids ({len(SPECIAL_TOKENS)} special + 256 byte + {len(alphabet)} character "
            "pieces)"
        )
    vocab: dict[str, int] = {tok: i for i, tok in enumerate(base)}
    merges = _learn_merges(dict(word_counts), vocab_size - len(base))
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))  # a merge may re-create an existing piece
    unused = [f"<unused{i}>" for i in range(vocab_size - len(vocab))]
    for tok in unused:
        vocab[tok] = len(vocab)
    assert len(vocab) == vocab_size

    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.pre_tokenizer = pre_tok
    tok.decoder = decoders.Sequence([decoders.Replace(SPIECE_UNDERLINE, " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B:1", special_tokens=[("<bos>", 2)]
    )
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in (*SPECIAL_TOKENS, *unused)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        eos_token="<eos>",
        bos_token="<bos>",
        unk_token="<unk>",
        clean_up_tokenization_spaces=False,
    )


def save_tokenizer(tok: PreTrainedTokenizerBase, folder: str | os.PathLike[str]) -> list[str]:
    """Write ``tok`` into ``folder`` (``tokenizer.json`` + ``tokenizer_config.json``); return the files."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    return [str(p) for p in tok.save_pretrained(str(folder))]


_SPM_NAMES = ("tokenizer.model", "paligemma_tokenizer.model", "spm.model")
#: Largest tokenizer file read (PaliGemma's ``tokenizer.json`` is ~17 MiB, its SentencePiece model ~4 MiB).
TOKENIZER_MAX_BYTES = 64 * 2**20
_CONFIG_JSONS = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")


def _load(root: Path, path: Path) -> PreTrainedTokenizerBase:
    """The tokenizer of ``path`` (``tokenizer.json`` or a SentencePiece model) in ``root``."""
    if path.name == "tokenizer.json":
        if (root / "tokenizer_config.json").is_file():
            return AutoTokenizer.from_pretrained(str(root), local_files_only=True, trust_remote_code=False)
        vocab = Tokenizer.from_file(str(path)).get_vocab(with_added_tokens=True)
        named = {f"{k}_token": t for k, t in zip(("pad", "eos", "bos", "unk"), SPECIAL_TOKENS) if t in vocab}
        return PreTrainedTokenizerFast(tokenizer_file=str(path), clean_up_tokenization_spaces=False, **named)
    if path.name == "tokenizer.model":
        spm: PreTrainedTokenizerBase = GemmaTokenizer.from_pretrained(str(root), local_files_only=True)
        return spm
    with tempfile.TemporaryDirectory() as tmp:  # transformers looks for "tokenizer.model"
        shutil.copyfile(path, Path(tmp) / "tokenizer.model")
        spm = GemmaTokenizer.from_pretrained(tmp, local_files_only=True)
        return spm


def load_tokenizer(folder: str | os.PathLike[str], vocab_size: int | None = None) -> PreTrainedTokenizerBase:
    """Load the tokenizer stored in a checkpoint folder (offline; never touches the hub, never runs
    code from the folder).

    Looks, in order, for ``tokenizer.json`` (loaded with ``AutoTokenizer`` when a
    ``tokenizer_config.json`` is present, else as a plain ``PreTrainedTokenizerFast``), then for a
    SentencePiece model (``tokenizer.model``, ``paligemma_tokenizer.model`` as openpi names it,
    ``spm.model``), converted by transformers' ``GemmaTokenizer`` (needs ``sentencepiece``).

    Args:
        folder: the checkpoint folder.
        vocab_size: the model's vocabulary size; when given, a tokenizer with more ids (which the
            model could not embed) is refused.

    Raises:
        FileNotFoundError: none of those files exists (the message lists what was looked for).
        CheckpointError: naming the file: larger than ``TOKENIZER_MAX_BYTES``, a malformed
            ``tokenizer_config.json`` / ``special_tokens_map.json`` / ``added_tokens.json`` (one
            naming a ``*_file`` outside the folder), a tokenizer file that does not load (whatever
            the parser raised), no BOS token, or more ids than ``vocab_size``.
    """
    root = Path(folder)
    names = ("tokenizer.json", *_SPM_NAMES)
    path = next((root / n for n in names if (root / n).is_file()), None)
    if path is None:
        raise FileNotFoundError(f"no tokenizer found in {root}: looked for {', '.join(str(root / n) for n in names)}")
    if path.stat().st_size > TOKENIZER_MAX_BYTES:
        raise CheckpointError(f"{path}: larger than the {TOKENIZER_MAX_BYTES // 2**20} MiB a tokenizer file may have")
    if path.name == "tokenizer.json":
        for name in _CONFIG_JSONS:
            if (root / name).is_file():
                for key, value in read_json(root / name).items():  # transformers opens *_file entries
                    if key.endswith("_file") and value is not None:
                        inside(root, value, f"{root / name}: {key}")
    try:
        tok = _load(root, path)
    except Exception as e:  # whatever transformers / tokenizers / sentencepiece raise on a bad file
        raise CheckpointError(f"{path}: not a usable tokenizer ({type(e).__name__}: {short(str(e), 200)})") from e
    if tok.bos_token_id is None:
        raise CheckpointError(f"{path}: the tokenizer has no BOS token (π0.5 prompts start with <bos>)")
    if vocab_size is not None and len(tok) > vocab_size:
        raise CheckpointError(
            f"{path}: the tokenizer has {len(tok)} ids but the model embeds only {vocab_size} "
            "(vocab_size): not this model's tokenizer"
        )
    return tok


__all__ = [
    "SPECIAL_TOKENS",
    "BYTE_TOKENS",
    "TOKENIZER_MAX_BYTES",
    "build_tokenizer",
    "save_tokenizer",
    "load_tokenizer",
    "corpus",
]
