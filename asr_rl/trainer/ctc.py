"""Auxiliary CTC on the audio encoder output, for SFT from scratch.

Cross-entropy alone lets a tiny decoder learn the grammar while ignoring the audio; a CTC loss on
the encoder (Graves et al., 2006, "Connectionist Temporal Classification", ICML) forces the encoder
to carry the transcript, and then the decoder listens (ENVIRONMENT.md: CER 70-80% without it, 34% with
it at equal time). The Qwen3-ASR tower emits ~13 frames/s while speech reaches ~21 characters/s, and
CTC needs at least one frame per label, so each frame predicts `labels_per_frame` consecutive CTC
slots. The head is training-only: it is saved in the resume state, not in the HF folder.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class CTCHead(nn.Module):
    def __init__(self, d_audio: int, vocab_size: int, blank_id: int, labels_per_frame: int = 3,
                 loss_weight: float = 1.0):
        super().__init__()
        self.loss_weight = loss_weight  # of the CTC term in the SFT loss
        self.vocab_size = vocab_size
        self.blank_id = blank_id
        self.k = labels_per_frame
        self.proj = nn.Linear(d_audio, vocab_size * labels_per_frame)

    def forward(self, states: torch.Tensor, lengths: torch.Tensor, targets: list[list[int]]) -> torch.Tensor:
        """CTC loss, mean over utterances of the per-target-token loss.

        Args:
            states: packed encoder output `(sum_i L_i, d_audio)`, utterances in batch order.
            lengths: `(B,)` frames per utterance (L_i).
            targets: B label-id lists (no blanks).
        """
        logits = self.proj(states).view(-1, self.vocab_size)  # (sum_i L_i * k, V)
        log_probs = F.log_softmax(logits.float(), dim=-1)
        per_utt = torch.split(log_probs, (lengths * self.k).tolist(), dim=0)
        padded = nn.utils.rnn.pad_sequence(per_utt, batch_first=False)  # (T, B, V)
        flat = torch.as_tensor([t for seq in targets for t in seq], dtype=torch.long, device=states.device)
        target_lengths = torch.as_tensor([len(t) for t in targets], dtype=torch.long, device=states.device)
        # zero_infinity: an utterance too short for its transcript contributes 0, not inf.
        return F.ctc_loss(padded, flat, lengths * self.k, target_lengths, blank=self.blank_id,
                          reduction="mean", zero_infinity=True)
