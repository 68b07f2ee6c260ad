"""The special tokens and their fixed ids. This module alone defines them; everything else
(tokenizer training, collation, masks, decoding) imports them from here."""

PAD, BOS, EOS, UNK = 0, 1, 2, 3
PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN)  # index == id
