"""The CTC head is sized by the labels the transcripts use, and scores them like CTC over the
full vocabulary restricted to those labels."""
import pytest
import torch
import torch.nn.functional as F

from asr_rl.models.ctc import CTCHead


def test_head_is_sized_by_the_labels_used_and_maps_them():
    torch.manual_seed(0)
    head = CTCHead(d_audio=8, label_ids=[151_000, 7, 42, 7], labels_per_frame=2)
    # blank + 3 labels, times 2 slots per frame: not 151,001 x 2 outputs
    assert head.vocab_size == 4 and head.proj.out_features == 8
    states, lengths = torch.randn(5, 8), torch.tensor([3, 2])
    loss = head(states, lengths, [[42, 151_000], [7]])
    # by hand: classes 0 = blank, 1 = id 7, 2 = id 42, 3 = id 151000; slots = frames x 2
    logp = F.log_softmax(head.proj(states).view(-1, 4), dim=-1)
    padded = torch.nn.utils.rnn.pad_sequence(torch.split(logp, [6, 4]), batch_first=False)
    expected = F.ctc_loss(padded, torch.tensor([2, 3, 1]), torch.tensor([6, 4]), torch.tensor([2, 1]), blank=0,
                          zero_infinity=True)
    assert torch.allclose(loss, expected)
    with pytest.raises(ValueError, match=r"CTC labels \[5\] are not among the head's labels"):
        head(states, lengths, [[5], [7]])


def test_bf16_encoder_states_go_through_an_fp32_head():
    head = CTCHead(d_audio=8, label_ids=[3, 4])
    loss = head(torch.randn(4, 8, dtype=torch.bfloat16), torch.tensor([4]), [[3, 4]])
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
