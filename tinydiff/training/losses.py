"""The training objectives of `tinydiff train`: each a loss in nats per token, and the validation loss.

Each function takes the torch module as its first argument (torch is an optional extra, imported
only by train.run_train) and a torch_llama.Llama; everything random draws from the generator it is
given, so a resumed run draws the same masks. Objectives, per sequence of token ids x (L tokens):

    ar   mean over positions of -log p(x[i+1] | x[..i]), causal attention.
    mdm  t ~ U(eps, 1) (stratified over the batch); each token replaced by <|mask|> with
         probability t; loss = sum over masked i of -log p(x[i] | masked x) / t, divided by L (the
         MDLM/LLaDA bound on -log p(x) per token, so both losses are nats per token), bidirectional.
         --shift-logits (Dream, DiffuLLaMA): x[i] is predicted by row i-1, as an AR model predicts
         it, so an AR model given by --init starts from its own habits (x[0] is never masked).
    mlm15 (BERT, Devlin et al. 2019): 15% of the tokens chosen; of those 80% become <|mask|>,
         10% a random token, 10% stay; loss = mean CE over the chosen tokens, bidirectional. A
         masked-diffusion model frozen at one mask rate (t = 0.15, unweighted): the twin that
         shows what training at every rate buys.
    block (BD3-LM's objective, with an AR model's conventions so an AR checkpoint adapts to it
         SDAR-style, --init): x is cut into blocks of --block-size; each block gets its own rate
         t ~ U(eps, 1) and is masked at it. One pass runs [noisy x ; clean x] (positions 0..L-1
         twice): the clean half causally, as an AR model reads text; a noisy block sees itself
         (bidirectionally) and the clean positions before it, never a later block. Row i predicts
         position i+1, as in the AR model: a masked position is predicted from the noisy row before
         it, the first of a block from the clean row before it (the row decoding keeps when it caches
         a block, decoding/diffusion.py). loss = sum over masked positions of CE / t over L, plus
         the clean half's next-token CE, which keeps the rows the next block starts from sharp.
"""
MDM_EPS = 1e-3          # smallest mask rate drawn: keeps the 1/t weight finite
MLM_RATE = 0.15


def ar_loss(torch, model, x, input_mask=0.0, mask_id=None, gen=None):
    """Mean next-token cross-entropy over the sequence (nats per predicted token). input_mask: the
    share of input tokens replaced by mask_id (the targets are the true tokens)."""
    inputs = x[:, :-1]
    if input_mask:
        inputs = torch.where(torch.rand(inputs.shape, generator=gen) < input_mask, mask_id, inputs)
    logits = model.logits(model.hidden(inputs, causal=True))
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))


def mdm_mask(torch, x, t, mask_id, gen, shift=False):
    """(masked input, bool mask): each token masked with its sequence's probability t [B]; with
    shift, never the first (no row before it to predict it)."""
    m = torch.rand(x.shape, generator=gen) < t[:, None]
    if shift:
        m[:, 0] = False
    return torch.where(m, torch.full_like(x, mask_id), x), m


def mdm_loss(torch, model, x, t, mask_id, gen, shift=False):
    """The masked-diffusion bound on -log p(x) per token: sum over masked tokens of CE / t, over B*L.
    shift (Dream): position i is predicted by row i-1."""
    xm, m = mdm_mask(torch, x, t, mask_id, gen, shift)
    h = model.hidden(xm, causal=False)
    if shift:
        h = torch.cat([h[:, :1], h[:, :-1]], dim=1)                            # row i-1 -> position i
    h = h[m]                                                                  # [n_masked, d]
    ce = torch.nn.functional.cross_entropy(model.logits(h), x[m], reduction="none")
    weight = (1.0 / t)[:, None].expand_as(x)[m]
    return (ce * weight).sum() / x.numel()


def mask_rates(torch, n, gen):
    """n mask rates in (eps, 1), one per sequence: t_i = (u + i/n) mod 1 for one uniform u, MDLM's
    low-discrepancy sampler. Each t is still uniform, so the loss is the same bound, but a batch
    covers the range evenly and the gradient's variance drops."""
    u = torch.rand(1, generator=gen)
    return MDM_EPS + (1 - MDM_EPS) * torch.remainder(u + torch.arange(n) / n, 1.0)


def mlm_corrupt(torch, x, mask_id, vocab_size, gen):
    """(BERT's input, bool chosen): MLM_RATE of the tokens chosen; of those 80% <|mask|>, 10% a
    random id, 10% kept."""
    chosen = torch.rand(x.shape, generator=gen) < MLM_RATE
    how = torch.rand(x.shape, generator=gen)
    random_ids = torch.randint(0, vocab_size, x.shape, generator=gen)
    return torch.where(chosen & (how < 0.8), mask_id, torch.where(chosen & (how < 0.9), random_ids, x)), chosen


def mlm_loss(torch, model, x, mask_id, gen):
    """BERT's masked-LM loss (module docstring), nats per chosen token."""
    xm, chosen = mlm_corrupt(torch, x, mask_id, model.model.embed_tokens.num_embeddings, gen)
    h = model.hidden(xm, causal=False)[chosen]                                # [n_chosen, d]
    return torch.nn.functional.cross_entropy(model.logits(h), x[chosen])


def block_attention(torch, L, b):
    """The bool [2L, 2L] mask of the block objective's pass over [noisy ; clean] (True = may attend):
    clean rows causal over the clean half; a noisy block over itself and the clean positions before it."""
    i = torch.arange(L)
    blk = i // b
    noisy_noisy = blk[None, :] == blk[:, None]
    noisy_clean = blk[None, :] < blk[:, None]
    clean_clean = i[None, :] <= i[:, None]
    top = torch.cat([noisy_noisy, noisy_clean], dim=1)
    bottom = torch.cat([torch.zeros(L, L, dtype=torch.bool), clean_clean], dim=1)
    return torch.cat([top, bottom], dim=0)


def block_loss(torch, model, x, b, mask_id, gen):
    """The block objective (module docstring), nats per token: masked CE / t over B*L, plus the
    clean half's next-token CE."""
    B, L = x.shape
    t = MDM_EPS + (1 - MDM_EPS) * torch.rand(B, L // b, generator=gen)       # a rate per block
    t_pos = t.repeat_interleave(b, dim=1)                                     # [B, L]
    m = torch.rand(x.shape, generator=gen) < t_pos
    m[:, 0] = False                                                           # no row before it
    xt = torch.where(m, torch.full_like(x, mask_id), x)
    pos = torch.arange(L)
    h = model.hidden(torch.cat([xt, x], dim=1), block_attention(torch, L, b), torch.cat([pos, pos]))
    src = torch.where(pos % b == 0, L + pos - 1, pos - 1)                   # the row that predicts position i
    rows = h[:, src.clamp(min=0)][m]                                         # [n_masked, d]
    F = torch.nn.functional
    ce = F.cross_entropy(model.logits(rows), x[m], reduction="none")
    clean = model.logits(h[:, L:-1])                                          # clean rows predict the next token
    ar = F.cross_entropy(clean.reshape(-1, clean.shape[-1]), x[:, 1:].reshape(-1))
    return (ce / t_pos[m]).sum() / x.numel() + ar


def step_generator(torch, seed, step):
    """The random stream of one training step: a resumed run draws the same masks."""
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


def autocast(torch, args):
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16")


def train_loss(torch, model, x, args, mask_id, step):
    """The loss of step `step` on the batch x under args.objective, its randomness seeded by the step."""
    torch.manual_seed(args.seed * 1_000_003 + step)      # dropout's stream: a resumed run drops the same
    with autocast(torch, args):
        gen = step_generator(torch, args.seed, step)
        if args.objective == "ar":
            return ar_loss(torch, model, x, args.input_mask, mask_id, gen)
        if args.objective == "block":
            return block_loss(torch, model, x, args.block_size, mask_id, gen)
        if args.objective == "mlm15":
            return mlm_loss(torch, model, x, mask_id, gen)
        return mdm_loss(torch, model, x, mask_rates(torch, x.shape[0], gen), mask_id, gen, args.shift_logits)


def validation_loss(torch, model, windows, args, mask_id, batch):
    """Validation loss, nats per token (mlm15: per chosen token). mdm: mask rates stratified over the
    windows, t_i in the i-th of n equal slices of (eps, 1), from a fixed seed so every evaluation
    sees the same masks."""
    model.eval()
    x_all = torch.from_numpy(windows)
    n = len(windows)
    gen = torch.Generator().manual_seed(12345)
    t_all = MDM_EPS + (1 - MDM_EPS) * (torch.randperm(n, generator=gen) + torch.rand(n, generator=gen)) / n
    total, count = 0.0, 0
    with torch.no_grad(), autocast(torch, args):
        for i in range(0, n, batch):
            x = x_all[i:i + batch]
            if args.objective == "ar":
                total += ar_loss(torch, model, x).item() * x[:, 1:].numel()
                count += x[:, 1:].numel()
            elif args.objective == "block":
                total += block_loss(torch, model, x, args.block_size, mask_id, gen).item() * x.numel()
                count += x.numel()
            elif args.objective == "mlm15":                          # per chosen token, batches weighed
                total += mlm_loss(torch, model, x, mask_id, gen).item() * x.numel()   # by their size
                count += x.numel()
            else:
                total += mdm_loss(torch, model, x, t_all[i:i + batch], mask_id, gen,
                                  args.shift_logits).item() * x.numel()
                count += x.numel()
    model.train()
    return total / count
