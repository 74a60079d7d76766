"""The plain-transformers check each family test runs: a checkpoint we save loads with transformers
alone (no asr_rl import) and gives our logits for the same utterance."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from asr_rl.models.audio_policy import AudioPolicy

# the utterance both sides score; the script under test must build the same one
WAV = (0.3 * np.sin(np.arange(24000) / 16000 * 2 * np.pi * 300)).astype(np.float32)
WAV_CODE = "wav = (0.3 * np.sin(np.arange(24000) / 16000 * 2 * np.pi * 300)).astype(np.float32)"


def check_plain_reload(policy: AudioPolicy, tmp_path: Path, script: str) -> AudioPolicy:
    """Save `policy`; run `script` (argv: checkpoint, output; it saves {"logits", "ids"} for `WAV`);
    assert our reload gives the same prompt ids and logits. Returns the reloaded policy."""
    policy.save_pretrained(tmp_path / "ckpt")
    (tmp_path / "plain.py").write_text(script)
    res = subprocess.run([sys.executable, str(tmp_path / "plain.py"), str(tmp_path / "ckpt"), str(tmp_path / "o.pt")],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    plain = torch.load(tmp_path / "o.pt")
    again = AudioPolicy.from_pretrained(tmp_path / "ckpt")
    prompts = again.prepare([WAV], ["en"])
    assert torch.equal(prompts.input_ids, plain["ids"])
    again.model.eval()
    with torch.no_grad():
        ours = again.model(inputs_embeds=again.prompt_embeds(prompts, again.encode_audio(prompts)),
                           attention_mask=prompts.attention_mask).logits
    assert torch.allclose(ours, plain["logits"], atol=1e-5), (ours - plain["logits"]).abs().max()
    return again
