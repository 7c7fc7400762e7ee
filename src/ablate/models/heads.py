"""Task heads beyond the Hugging Face models' own linear ones (``model.head``)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from transformers.modeling_outputs import TokenClassifierOutput

from ablate.data.encode import IGNORE

HEADS = ("linear", "bilstm")


class BiLSTMTokenClassifier(nn.Module):
    """Encoder -> dropout -> BiLSTM -> dropout -> linear classifier, one label per sub-word.

    The contract of ``AutoModelForTokenClassification``: ``forward(input_ids, attention_mask,
    labels=None)`` returns a ``TokenClassifierOutput`` whose ``loss`` (cross-entropy over the
    positions whose label is not -100) is set when labels are given. Padding must be on the right
    (the tokenizers of BERT-family encoders pad there): the LSTM reads only the real sub-words.
    """

    # The loss is a mean over the batch's labelled positions; the Trainer must not pass
    # ``num_items_in_batch`` expecting a sum.
    accepts_loss_kwargs = False
    main_input_name = "input_ids"

    def __init__(self, encoder: nn.Module, num_labels: int, lstm_hidden: int, dropout: float):
        super().__init__()
        self.encoder = encoder
        self.config = encoder.config  # the Trainer and peft read it
        self.dropout = nn.Dropout(dropout)
        self.lstm = nn.LSTM(
            encoder.config.hidden_size, lstm_hidden, batch_first=True, bidirectional=True
        )
        self.classifier = nn.Linear(2 * lstm_hidden, num_labels)

    @property
    def device(self) -> torch.device:
        """The encoder's device (a transformers pipeline reads it)."""
        return self.encoder.device

    @property
    def dtype(self) -> torch.dtype:
        """The encoder's dtype (a transformers pipeline reads it)."""
        return self.encoder.dtype

    @property
    def base_model(self) -> nn.Module:
        """The encoder, as ``base_model`` is for Hugging Face task models."""
        return self.encoder

    def get_input_embeddings(self) -> nn.Module:
        return self.encoder.get_input_embeddings()

    def forward(self, input_ids=None, attention_mask=None, labels=None, **kwargs):
        # Callers (the Trainer, peft) pass flags such as return_dict; only inputs go on.
        extra = {
            k: v
            for k, v in kwargs.items()
            if k in ("token_type_ids", "position_ids", "inputs_embeds") and v is not None
        }
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask, **extra)[0]
        hidden = self.dropout(hidden)
        if attention_mask is None:
            out, _ = self.lstm(hidden)
        else:
            lengths = attention_mask.sum(dim=1).clamp(min=1).cpu()
            packed = pack_padded_sequence(hidden, lengths, batch_first=True, enforce_sorted=False)
            out, _ = self.lstm(packed)
            out, _ = pad_packed_sequence(out, batch_first=True, total_length=hidden.size(1))
        logits = self.classifier(self.dropout(out))
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(
                logits.reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=IGNORE
            )
        return TokenClassifierOutput(loss=loss, logits=logits)
