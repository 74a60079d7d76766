"""An acoustic scorer: how well a transcript fits the audio, from a model apart from the policy's decoder.

A small CTC model (Graves et al., 2006) over characters reads the frozen audio encoder's states and
gives log P(text | audio), summed over every alignment of the text's characters to the frames
(the forced-alignment likelihood). It is trained on the labelled source transcripts
(`asr-rl train scorer`) and never on the policy's outputs, so a reward built on it
(rewards/acoustic.py) judges what was said, where a grammar verifier only judges what a valid
command looks like: "call anna" and "call emma" are both valid commands, and only one of them fits
the audio. It needs no transcript at reward time, and it hears silence: an empty text is the
all-blank path, likely where nobody speaks and unlikely over speech.

Its folder holds `scorer.json` (labels and sizes), `scorer.safetensors` and `encoder/`: the audio
model whose frozen encoder it reads (any family's `AudioPolicy` folder), so that the folder stands
alone. Labels are the characters of the normalised transcripts (rewards/normalize.py), every
language the source has; a character it never saw has no label, and a text holding one gets the
lowest score.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from asr_rl.rewards.normalize import normalize_text

CONFIG, WEIGHTS = "scorer.json", "scorer.safetensors"


BODIES = ("lstm", "conv")


class ConvBody(nn.Module):
    """`layers` residual blocks of a pre-norm 1-D convolution over frames (kernel 5, dilation 1, 2, 4,
    ...: 4 layers see 61 frames, 2.4 s at 25 frames/s), each frame past an utterance's length zeroed
    before every convolution, so that a padded batch reads each utterance as alone."""

    def __init__(self, hidden: int, layers: int, kernel: int = 5):
        super().__init__()
        self.norms = nn.ModuleList(nn.LayerNorm(hidden) for _ in range(layers))
        self.convs = nn.ModuleList(nn.Conv1d(hidden, hidden, kernel, padding=kernel // 2 * 2 ** i, dilation=2 ** i)
                                   for i in range(layers))

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """`(B, L, hidden)`, `(B,)` -> `(B, L, hidden)`."""
        mask = (torch.arange(x.shape[1], device=x.device)[None] < lengths.to(x.device)[:, None]).unsqueeze(-1)
        x = x * mask
        for norm, conv in zip(self.norms, self.convs):
            x = x + F.gelu(conv((norm(x) * mask).transpose(1, 2)).transpose(1, 2)) * mask
        return x


class AcousticScorer(nn.Module):
    """Frame states `(B, L, d_audio)` -> per-slot character log-probs `(B, L * k, V)`, V = labels + blank.

    A projection, a body over the frames (`lstm`: a bidirectional LSTM; `conv`: dilated residual
    convolutions, `ConvBody`: a training step in about half the BiLSTM's time at 2 layers on CPU,
    scripts/bench_scorer_body.py) and a linear CTC head; each
    frame predicts `labels_per_frame` slots (an encoder at 25 frames/s is slower than fast speech: CTC
    needs a slot per character)."""

    def __init__(self, d_audio: int, chars: list[str], hidden: int = 256, layers: int = 2, labels_per_frame: int = 2,
                 body: str = "lstm"):
        super().__init__()
        if body not in BODIES:
            raise ValueError(f"the scorer's body must be one of {', '.join(BODIES)}, got {body!r}")
        self.chars, self.k, self.body = list(chars), labels_per_frame, body
        self.config = {"d_audio": d_audio, "chars": self.chars, "hidden": hidden, "layers": layers,
                       "labels_per_frame": labels_per_frame, "body": body}
        self.index = {c: i + 1 for i, c in enumerate(self.chars)}  # 0 is the blank
        self.proj = nn.Linear(d_audio, hidden)
        if body == "conv":
            self.conv = ConvBody(hidden, layers)
        else:
            self.rnn = nn.LSTM(hidden, hidden // 2, num_layers=layers, bidirectional=True, batch_first=True)
        self.head = nn.Linear(hidden, (len(self.chars) + 1) * labels_per_frame)

    def forward(self, states: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        x = F.gelu(self.proj(states.float()))
        if self.body == "conv":
            out = self.conv(x, lengths)
        else:
            packed = nn.utils.rnn.pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
            out, _ = self.rnn(packed)
            out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=states.shape[1])
        B, L, _ = out.shape
        return F.log_softmax(self.head(out).view(B, L * self.k, -1), dim=-1)

    def read(self, states: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Unpadded states `(L_i, d_audio)` -> padded log-probs `(A, max L * k, V)` and `(A,)` frames."""
        lengths = torch.as_tensor([s.shape[0] for s in states])
        return self(nn.utils.rnn.pad_sequence(states, batch_first=True), lengths), lengths

    def labels(self, text: str) -> list[int] | None:
        """The CTC labels of `text`'s normalised characters; None when one has no label."""
        out = [self.index.get(c) for c in normalize_text(text)]
        return None if any(i is None for i in out) else out

    def log_likelihood(self, states: list[torch.Tensor], texts: list[str], audio_index: list[int]) -> torch.Tensor:
        """`(N,)` log P(text_j | audio of `audio_index[j]`) for N texts; each audio `(L_i, d_audio)` is
        read once however many texts it scores. -inf where a text has an unknown character or more
        labels than the audio has slots."""
        logp, lengths = self.read(states)  # (A, L * k, V)
        labels = [self.labels(t) for t in texts]
        known = [j for j, lab in enumerate(labels) if lab is not None]
        out = torch.full((len(texts),), float("-inf"))
        if not known:
            return out
        idx = torch.as_tensor([audio_index[j] for j in known])
        targets = [torch.as_tensor(labels[j], dtype=torch.long) for j in known]
        target_lengths = torch.as_tensor([len(t) for t in targets])
        flat = torch.cat(targets) if any(len(t) for t in targets) else torch.zeros(0, dtype=torch.long)
        nll = F.ctc_loss(logp[idx].transpose(0, 1), flat, lengths[idx] * self.k, target_lengths, blank=0,
                         reduction="none", zero_infinity=False)
        out[torch.as_tensor(known)] = -nll.detach().float()
        return out

    def loss(self, states: list[torch.Tensor], texts: list[str]) -> torch.Tensor:
        """Training: mean over utterances of the per-character CTC loss (texts with an unknown
        character are not expected: the labels come from these transcripts)."""
        logp, lengths = self.read(states)
        targets = [torch.as_tensor(self.labels(t) or [], dtype=torch.long) for t in texts]
        return F.ctc_loss(logp.transpose(0, 1), torch.cat(targets), lengths * self.k,
                          torch.as_tensor([len(t) for t in targets]), blank=0, reduction="mean", zero_infinity=True)

    @torch.no_grad()
    def greedy(self, states: list[torch.Tensor]) -> list[str]:
        """Best-path decoding (a check that the scorer has learnt to hear: its CER on dev)."""
        logp, lengths = self.read(states)
        best = logp.argmax(-1)
        out = []
        for row, n in zip(best.tolist(), (lengths * self.k).tolist()):
            ids = [a for i, a in enumerate(row[:n]) if a != 0 and (i == 0 or a != row[i - 1])]
            out.append("".join(self.chars[i - 1] for i in ids))
        return out

    def save(self, folder: str | Path) -> None:
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / CONFIG).write_text(json.dumps(self.config, ensure_ascii=False, indent=1))
        save_file({k: v.contiguous() for k, v in self.state_dict().items()}, str(folder / WEIGHTS))

    @classmethod
    def load(cls, folder: str | Path) -> "AcousticScorer":
        from safetensors.torch import load_file

        folder = Path(folder)
        if not (folder / CONFIG).is_file() or not (folder / WEIGHTS).is_file():
            raise FileNotFoundError(f"{folder} is not an acoustic scorer folder (no {CONFIG} / {WEIGHTS}): "
                                    "make one with `asr-rl train scorer`")
        scorer = cls(**json.loads((folder / CONFIG).read_text()))
        try:
            weights = load_file(str(folder / WEIGHTS))
        except Exception as e:  # safetensors' own error names neither the file nor what to do
            raise ValueError(f"{folder / WEIGHTS} cannot be read ({type(e).__name__}: {e}): the file is cut short or "
                             "damaged; train the scorer again with `asr-rl train scorer`") from None
        scorer.load_state_dict(weights, strict=True)
        return scorer.eval()


def source_chars(texts) -> list[str]:
    """The sorted characters of the normalised texts: the scorer's labels."""
    return sorted({c for t in texts for c in normalize_text(t)})
