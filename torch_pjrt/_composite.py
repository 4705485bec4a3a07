"""Kernels that PyTorch implements only for CPU and CUDA, written in tpu ops.

Some ATen ops have no decomposition, only per-device kernels, yet PyTorch's
own modules call them on any PrivateUse1 device: nn.LSTM/GRU's fused cells,
GradScaler's unscale and update, nn.MultiheadAttention's and
nn.TransformerEncoderLayer's inference fast path, the fused optimizers
(fused=True), torch.mode, F.rrelu and F.ctc_loss.  Each function here
computes what the CPU kernel computes, from ops that have lowerings, so the
work stays on the device and never waits for it.  The eager fallback
(_dispatch._fallback) finds them by op name in KERNELS; compiled mode uses
them as decompositions (_compile._decompositions).
"""
import math

import torch
import torch.nn.functional as F


def _amp_unscale(grads, found_inf, inv_scale):
    """GradScaler's unscale (CUDA's kernel, in tpu ops, so the step never
    waits for the device): every gradient times inv_scale, in place, and
    found_inf set to 1 when any holds an inf or NaN."""
    for g in grads:
        bad = torch.logical_not(torch.isfinite(g)).any().to(found_inf.dtype)
        found_inf.copy_(torch.maximum(found_inf, bad))
        g.mul_(inv_scale)


def _amp_update_scale(scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval):
    """GradScaler's update (CUDA's kernel): back off after an inf/NaN step;
    grow after growth_interval good steps in a row, if the grown scale is
    finite."""
    found = found_inf > 0
    successful = growth_tracker + 1
    grown = scale * growth_factor
    grow = torch.logical_and(torch.logical_not(found), successful == growth_interval)
    new_scale = torch.where(found, scale * backoff_factor,
                            torch.where(torch.logical_and(grow, torch.isfinite(grown)), grown, scale))
    tracker = torch.where(torch.logical_or(found, grow), torch.zeros_like(successful), successful)
    scale.copy_(new_scale)
    growth_tracker.copy_(tracker)
    return scale


# nn.LSTM/nn.GRU on any PrivateUse1 device call the fused cell ops that only
# CUDA implements.  These are CUDA's kernels (aten/src/ATen/native/cuda/
# RNN.cu), in device ops, with its workspace layouts: LSTM [i, f, g, o]
# activated gates, GRU [r, z, n, hx, hn].


def _lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    gates = input_gates + hidden_gates
    if input_bias is not None:
        gates = gates + input_bias + hidden_bias
    i, f, g, o = gates.chunk(4, 1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    cy = f * cx + i * g
    return o * cy.tanh(), cy, torch.cat([i, f, g, o], 1)


def _lstm_cell_backward(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    i, f, g, o = workspace.chunk(4, 1)
    gcx = grad_cy if grad_cy is not None else torch.zeros_like(cx)
    tcy = cy.tanh()
    if grad_hy is not None:
        gcx = gcx + grad_hy * o * (1 - tcy * tcy)
        go = grad_hy * tcy
    else:
        go = torch.zeros_like(cx)
    grad_gates = torch.cat([gcx * g * (1 - i) * i, gcx * cx * (1 - f) * f, gcx * i * (1 - g * g),
                            go * (1 - o) * o], 1)
    return grad_gates, gcx * f, grad_gates.sum(0) if has_bias else None


def _gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    if input_bias is not None:
        input_gates, hidden_gates = input_gates + input_bias, hidden_gates + hidden_bias
    ir, ii, in_ = input_gates.chunk(3, 1)
    hr, hi, hn = hidden_gates.chunk(3, 1)
    r, z = (ir + hr).sigmoid(), (ii + hi).sigmoid()
    n = (in_ + r * hn).tanh()
    return n + z * (hx - n), torch.cat([r, z, n, hx, hn], 1)


def _gru_cell_backward(grad_hy, workspace, has_bias):
    r, z, n, hx, hn = workspace.chunk(5, 1)
    gz = grad_hy * (hx - n) * (1 - z) * z
    gn = grad_hy * (1 - z) * (1 - n * n)
    gr = gn * hn * (1 - r) * r
    grad_input = torch.cat([gr, gz, gn], 1)
    grad_hidden = torch.cat([gr, gz, gn * r], 1)
    if not has_bias:
        return grad_input, grad_hidden, grad_hy * z, None, None
    return grad_input, grad_hidden, grad_hy * z, grad_input.sum(0), grad_hidden.sum(0)


# nn.MultiheadAttention / nn.TransformerEncoderLayer inference fast path
# (eval mode, no grad): aten/src/ATen/native/transformers/attention.cpp and
# transformer.cpp, the math path the CPU takes.


def _masked_softmax(x, mask, dim=None, mask_type=None):
    """Softmax with masked (True) positions 0; a row masked entirely is NaN,
    as on the CPU.  mask_type 0: an (L, L) attention mask; 1: a (B, L) key
    padding mask, for 4-d (B, heads, L, L) input; 2: a mask shaped like the
    input."""
    if mask.dtype != torch.bool:
        raise RuntimeError("Mask should be a boolean tensor")
    dim = x.dim() - 1 if dim is None else dim % max(x.dim(), 1)
    if mask.dim() != 2 or x.dim() != 4:
        mask_type = 2
    if mask_type is None:
        raise RuntimeError("Mask Type should be defined")
    if mask_type == 1:
        if x.shape[0] != mask.shape[0] or x.shape[2] != mask.shape[1]:
            raise RuntimeError("For mask_type == 1 mask shape should be (B, L)")
        mask = mask.view(x.shape[0], 1, 1, x.shape[2])
    elif mask_type == 0:
        if x.shape[2] != mask.shape[0] or x.shape[2] != mask.shape[1]:
            raise RuntimeError("For mask_type == 0 mask shape should be (L, L)")
        mask = mask.view(1, 1, x.shape[2], x.shape[2])
    elif mask.shape != x.shape:
        raise RuntimeError("For mask_type == 2 mask shape should match input shape")
    return torch.softmax(x.masked_fill(mask.expand(x.shape), float("-inf")), dim)


def _masked_softmax_backward(grad_output, output, mask, dim=None):
    if mask.shape != grad_output.shape:
        raise RuntimeError("Mask shape should match grad shape")
    dim = output.dim() - 1 if dim is None else dim
    grad = output * (grad_output - (grad_output * output).sum(dim, keepdim=True))
    return grad.masked_fill(mask, 0)


def _transform_bias_rescale_qkv(qkv, qkv_bias, num_head):
    """[B, T, 3D] projections plus bias -> q / sqrt(dh), k, v as [B, heads, T, dh]."""
    B, T, three_d = qkv.shape
    D = three_d // 3
    if three_d % 3 != 0 or D % num_head != 0:
        raise RuntimeError(f"_transform_bias_rescale_qkv: the last dim ({three_d}) must be 3 * embed_dim, "
                           f"and embed_dim a multiple of num_head ({num_head})")
    dh = D // num_head
    q, k, v = (qkv + qkv_bias).view(B, T, 3, num_head, dh).permute(2, 0, 3, 1, 4).unbind(0)
    return q * (1.0 / math.sqrt(dh)), k.contiguous(), v.contiguous()


def _native_multi_head_attention(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight,
                                 proj_bias, mask=None, need_weights=True, average_attn_weights=True,
                                 mask_type=None):
    D = embed_dim
    for name, t in (("query", query), ("key", key), ("value", value)):
        if t.dim() != 3:
            raise RuntimeError(f"expected 3-D `{name}`, got {t.dim()}-D tensor")
    if query.shape[2] != D:
        raise RuntimeError(f"passed-in embed_dim {D} didn't match last dim of query {query.shape[2]}")
    if query.shape != key.shape or key.shape != value.shape:
        raise RuntimeError("expected `query`/`key`/`value` shapes to match")
    if qkv_weight.dim() != 2 or qkv_weight.shape[0] != 3 * D or qkv_weight.shape[1] != D:
        raise RuntimeError(f"expected `qkv_weight` of shape [3 * embed_dim, embed_dim], got {list(qkv_weight.shape)}")
    if qkv_bias.dim() != 1 or qkv_bias.shape[0] != 3 * D:
        raise RuntimeError(f"expected `qkv_bias` of shape [3 * embed_dim], got {list(qkv_bias.shape)}")
    if D % num_head != 0:
        raise RuntimeError("`embed_dim` must divide evenly by `num_heads`")
    if key is value and query is key:
        qkv = query @ qkv_weight.t()
    else:
        w_q, w_k, w_v = qkv_weight.chunk(3, 0)
        qkv = torch.cat([query @ w_q.t(), key @ w_k.t(), value @ w_v.t()], 2)
    if qkv.numel() == 0:
        return torch.empty_like(query), None
    q, k, v = _transform_bias_rescale_qkv(qkv, qkv_bias, num_head)
    scores = q @ k.transpose(2, 3)
    if mask is not None:
        attn = _masked_softmax(scores, mask.to(torch.bool), 3, mask_type)
    else:
        attn = torch.softmax(scores, 3)
    ctx = (attn @ v).transpose(1, 2).reshape(query.shape[0], query.shape[1], D)
    out = F.linear(ctx, proj_weight, proj_bias)
    if not need_weights:
        return out, None
    if average_attn_weights:
        attn = attn.sum(1) / num_head
    return out, attn


def _transformer_encoder_layer_fwd(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias,
                                   use_gelu, norm_first, eps, norm_weight_1, norm_bias_1, norm_weight_2,
                                   norm_bias_2, ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2, mask=None,
                                   mask_type=None):
    if src.numel() == 0:
        return src.clone()

    def norm(x, w, b):
        return F.layer_norm(x, (embed_dim,), w, b, eps)

    x = norm(src, norm_weight_1, norm_bias_1) if norm_first else src
    x = _native_multi_head_attention(x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight,
                                     proj_bias, mask, False, True, mask_type)[0] + src
    if not norm_first:
        x = norm(x, norm_weight_1, norm_bias_1)
    residual = x
    if norm_first:
        x = norm(x, norm_weight_2, norm_bias_2)
    h = F.linear(x, ffn_weight_1, ffn_bias_1)
    h = F.gelu(h) if use_gelu else F.relu(h)
    x = F.linear(h, ffn_weight_2, ffn_bias_2) + residual
    if not norm_first:
        x = norm(x, norm_weight_2, norm_bias_2)
    return x


def _nested_tensor_from_mask_left_aligned(t, mask):
    """nn.TransformerEncoder (eval, with a key padding mask) asks this before
    packing the batch into a NestedTensor, which the tpu device does not
    support.  Answering False sends it down the path it takes for masks that
    are not left-aligned: each layer's fast path with the padding mask.  The
    unpadded positions get the same values; the padded ones hold computed
    values instead of the nested path's zeros (as in training mode)."""
    return False


# Fused optimizers (torch.optim.Adam/AdamW/SGD/Adagrad with fused=True): the CPU
# kernels' arithmetic (aten/src/ATen/native/cpu/Fused*Kernel.cpp) per tensor,
# with the step counters on the device.  With a GradScaler, grads are divided
# by grad_scale (and stored unscaled), and a step with found_inf set changes
# nothing, decided on the device.


def _write(pairs, found_inf):
    skip = None if found_inf is None else (found_inf.reshape(()) > 0)
    for dst, val in pairs:
        dst.copy_(val if skip is None else torch.where(skip, dst, val))


def _opmath(t):
    """The fused optimizers' CPU kernels compute float16/bfloat16 tensors in
    float32 and round each stored value once (in half precision, Adam's
    g * g * (1 - beta2) and eps underflow to 0 and the update divides by 0)."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def _unscaled(grads, i, grad_scale, pairs):
    g = _opmath(grads[i])
    if grad_scale is not None:
        g = g / grad_scale.reshape(()).to(g.dtype)
        pairs.append((grads[i], g))
    return g


def _fused_adam(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr, beta1, beta2,
                weight_decay, eps, amsgrad, maximize, grad_scale=None, found_inf=None, adamw=False):
    for i, p in enumerate(params):
        pairs = []
        g = _unscaled(grads, i, grad_scale, pairs)
        if maximize:
            g = -g
        param = _opmath(p)
        if weight_decay != 0:
            if adamw:
                param = param - param * (lr * weight_decay)
            else:
                g = g + param * weight_decay
        m = _opmath(exp_avgs[i]) * beta1 + g * (1 - beta1)
        v = _opmath(exp_avg_sqs[i]) * beta2 + g * g * (1 - beta2)
        step = state_steps[i]
        step_size = lr / (1 - torch.pow(beta1, step))
        bc2_sqrt = torch.sqrt(1 - torch.pow(beta2, step))
        if amsgrad:
            v_max = torch.maximum(_opmath(max_exp_avg_sqs[i]), v)
            pairs.append((max_exp_avg_sqs[i], v_max))
            denom = v_max.sqrt() / bc2_sqrt + eps
        else:
            denom = v.sqrt() / bc2_sqrt + eps
        pairs += [(exp_avgs[i], m), (exp_avg_sqs[i], v), (p, param - step_size * m / denom)]
        _write(pairs, found_inf)


def _fused_adamw(*args, **kwargs):
    return _fused_adam(*args, adamw=True, **kwargs)


def _fused_sgd(params, grads, momentum_buffer_list, *, weight_decay, momentum, lr, dampening, nesterov, maximize,
               is_first_step, grad_scale=None, found_inf=None):
    # In the parameters' dtype, as the unfused SGD (float16/bfloat16: PyTorch's
    # CPU fused kernel differs from both by more than their precision).
    for i, p in enumerate(params):
        pairs = []
        g = _unscaled(grads, i, grad_scale, pairs).to(p.dtype)
        if maximize:
            g = -g
        if weight_decay != 0:
            g = g + p * weight_decay
        if momentum != 0:
            buf = g if is_first_step else momentum_buffer_list[i] * momentum + g * (1 - dampening)
            pairs.append((momentum_buffer_list[i], buf))
            g = g + buf * momentum if nesterov else buf
        pairs.append((p, p - lr * g))
        _write(pairs, found_inf)


def _fused_adagrad(params, grads, state_sums, state_steps, *, lr, lr_decay, weight_decay, eps, maximize,
                   grad_scale=None, found_inf=None):
    """The CPU kernel (FusedAdagradKernel.cpp): clr = lr / (1 + (step - 1) *
    lr_decay) from the (already incremented) step counter, in float64 as on
    the CPU; state_sum += g * g; param -= clr * g / (sqrt(state_sum) + eps).
    float16/bfloat16 tensors compute in float32 and round each stored value
    once (the CPU's per-element path; its vectorized path also rounds the
    hyperparameters to the tensors' dtype, a difference below their
    precision)."""
    for i, p in enumerate(params):
        pairs = []
        g = _unscaled(grads, i, grad_scale, pairs)
        if maximize:
            g = -g
        param = _opmath(p)
        ct = param.dtype
        if weight_decay != 0:
            g = g + param * weight_decay
        s = state_sums[i].to(ct) + g * g
        step = state_steps[i].reshape(()).to(torch.float64)
        clr = (lr / (1 + (step - 1) * lr_decay)).to(ct)
        pairs += [(state_sums[i], s), (p, param - clr * g / (s.sqrt() + eps))]
        _write(pairs, found_inf)


# Reductions and activations with only CPU/CUDA kernels.


def _mode(x, dim=-1, keepdim=False):
    """The most frequent value along dim (the smallest among ties; NaNs
    count as equal) and the index of its last occurrence, as on the CPU."""
    if x.dim() == 0:
        return x.clone(), torch.zeros((), dtype=torch.int64, device=x.device)
    dim = dim % x.dim()
    n = x.shape[dim]
    if n == 0:
        raise IndexError(f"mode(): Expected reduction dim {dim} to have non-zero size.")
    out_shape = [s for i, s in enumerate(x.shape) if i != dim]
    if x.numel() == 0:
        shape = list(x.shape)
        shape[dim] = 1
        values = x.new_empty(shape if keepdim else out_shape)
        return values, torch.empty(values.shape, dtype=torch.int64, device=x.device)
    values, order = torch.sort(x.movedim(dim, -1), dim=-1, stable=True)
    same = values[..., 1:] == values[..., :-1]
    if values.is_floating_point() or values.is_complex():
        same = same | (values[..., 1:].isnan() & values[..., :-1].isnan())
    pos = torch.arange(n, device=x.device).expand(values.shape)
    starts = torch.cat([torch.ones_like(same[..., :1]), ~same], -1)
    ends = torch.cat([~same, torch.ones_like(same[..., :1])], -1)
    first = torch.where(starts, pos, torch.zeros_like(pos)).cummax(-1).values
    counts = torch.where(ends, pos - first + 1, torch.zeros_like(pos))
    best = counts.argmax(-1, keepdim=True)  # the first maximum: the smallest value
    value = values.gather(-1, best).squeeze(-1)
    index = order.gather(-1, best).squeeze(-1)  # stable sort: the last occurrence
    if keepdim:
        value, index = value.unsqueeze(dim), index.unsqueeze(dim)
    return value, index


def _rrelu_with_noise(x, noise, lower=0.125, upper=1.0 / 3.0, training=False, generator=None):
    """Eval: leaky_relu with slope (lower + upper) / 2.  Training: each
    input <= 0 is scaled by a slope drawn from U(lower, upper), recorded in
    noise (1 elsewhere) for the backward."""
    if not training:
        return F.leaky_relu(x, (lower + upper) / 2)
    slope = torch.empty_like(x).uniform_(lower, upper, generator=generator)
    neg = x <= 0
    noise.copy_(torch.where(neg, slope, torch.ones_like(slope)))
    return torch.where(neg, x * slope, x)


def _rrelu_with_noise_(x, noise, lower=0.125, upper=1.0 / 3.0, training=False, generator=None):
    return x.copy_(_rrelu_with_noise(x, noise, lower, upper, training, generator))


def _rrelu_with_noise_functional(x, noise, lower=0.125, upper=1.0 / 3.0, training=False, generator=None):
    """rrelu_with_noise as functionalized graphs hold it, the noise returned
    as a new tensor (compiled mode's decomposition, in functional ops)."""
    if not training:
        return F.leaky_relu(x, (lower + upper) / 2), noise.clone()
    slope = torch.ops.aten.uniform.default(torch.empty_like(x), lower, upper, generator=generator)
    neg = x <= 0
    return torch.where(neg, x * slope, x), torch.where(neg, slope, torch.ones_like(slope)).to(noise.dtype)


def _multilabel_margin_loss_forward(x, target, reduction):
    """Per sample: the hinge 1 - (x[y] - x[i]) summed over its target classes
    y (the entries before the first -1, repeats counted) and its non-target
    classes i, over C; and the 0/1 mask of target classes."""
    X = x.reshape(1, -1) if x.dim() <= 1 else x
    T = target.reshape(1, -1) if target.dim() <= 1 else target
    if X.shape != T.shape:
        raise RuntimeError(f"inconsistent target size: {list(target.shape)} for input of size: {list(x.shape)}")
    C = X.shape[1]
    valid = (T >= 0).long().cumprod(1).bool()  # the entries before the first -1
    index = T.clamp(min=0).long()
    is_target = torch.zeros_like(X).scatter_reduce(1, index, valid.to(X.dtype), "amax")
    hinge = (1 - (X.gather(1, index).unsqueeze(2) - X.unsqueeze(1))).clamp(min=0)
    pairs = valid.unsqueeze(2) & (is_target == 0).unsqueeze(1)
    loss = (hinge * pairs).sum((1, 2)) / C
    if reduction == 1:
        loss = loss.mean()
    elif reduction == 2:
        loss = loss.sum()
    elif x.dim() <= 1:
        loss = loss.reshape(())
    return loss.to(x.dtype), is_target.reshape(x.shape)


# CTC loss (F.ctc_loss): the CPU kernel's alpha/beta recursions in log space
# (aten/src/ATen/native/LossCTC.cpp), vectorised over the batch and the
# extended target; one step per time step.  Lengths are host lists.


def _lengths(x):
    return [int(v) for v in (x.tolist() if isinstance(x, torch.Tensor) else x)]


def _ctc_setup(log_probs, targets, input_lengths, target_lengths, blank):
    """Per batch element: the extended target (blanks between and around the
    labels) and masks of its valid positions and of the allowed skips."""
    if log_probs.dim() != 3:
        raise RuntimeError(f"ctc_loss: expected log_probs of shape (T, N, C), got {list(log_probs.shape)}")
    T, N, C = log_probs.shape
    il, tl = _lengths(input_lengths), _lengths(target_lengths)
    if len(il) != N:
        raise RuntimeError(f"input_lengths must be of size batch_size ({N}), got {len(il)}")
    if len(tl) != N:
        raise RuntimeError(f"target_lengths must be of size batch_size ({N}), got {len(tl)}")
    if not 0 <= blank < C:
        raise RuntimeError(f"blank must be in label range (0 <= blank < {C}), got {blank}")
    for v in il:
        if v < 0 or v > T:
            raise RuntimeError(f"Expected input_lengths to have value at most {T}, but got value {v}")
    L = max(tl + [0])
    dev = log_probs.device
    if targets.dim() == 1:  # concatenated targets
        starts = [sum(tl[:b]) for b in range(N)]
        if sum(tl) > targets.shape[0]:
            raise RuntimeError("Expected tensor to have size at least "
                               f"{sum(tl)} at dimension 0, but got size {targets.shape[0]}")
        idx = [[starts[b] + min(j, max(tl[b] - 1, 0)) for j in range(L)] for b in range(N)]
        labels = targets.to(dev)[torch.tensor(idx, dtype=torch.long, device=dev).reshape(N, L)] if L \
            else targets.new_zeros((N, 0)).to(dev)
    else:
        if targets.dim() != 2 or targets.shape[0] != N or any(v > targets.shape[1] for v in tl):
            raise RuntimeError(f"Expected targets of shape (N={N}, S >= max target length {L}) or 1-d, "
                               f"got {list(targets.shape)}")
        labels = targets[:, :L].to(dev)
    S = 2 * L + 1
    ext = torch.full((N, S), blank, dtype=torch.long, device=dev)
    if L:
        ext[:, 1::2] = labels.long()
    s_pos = torch.arange(S, device=dev)
    valid = s_pos.unsqueeze(0) < torch.tensor([2 * v + 1 for v in tl], device=dev).unsqueeze(1)
    prev2 = torch.cat([torch.full((N, 2), -1, dtype=torch.long, device=dev), ext[:, :-2]], 1)
    skip = (s_pos % 2 == 1).unsqueeze(0) & (ext != prev2) & (s_pos >= 2).unsqueeze(0)
    lp_ext = log_probs.gather(2, ext.unsqueeze(0).expand(T, N, S))
    return il, tl, ext, valid, skip, lp_ext


def _lse3(a, b, c):
    m = torch.maximum(torch.maximum(a, b), c)
    m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    return m_safe + torch.log(torch.exp(a - m_safe) + torch.exp(b - m_safe) + torch.exp(c - m_safe))


def _ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    il, tl, ext, valid, skip, lp_ext = _ctc_setup(log_probs, targets, input_lengths, target_lengths, blank)
    T, N, S = lp_ext.shape
    dev = log_probs.device
    ninf = torch.full((N, 1), float("-inf"), dtype=log_probs.dtype, device=dev)
    n_in = torch.tensor(il, device=dev).unsqueeze(1)
    first = (torch.arange(S, device=dev) < 2).unsqueeze(0) & valid & (n_in > 0)
    alpha = torch.where(first, lp_ext[0], ninf)
    alphas = [alpha]
    for t in range(1, T):
        a2 = torch.cat([ninf, alpha[:, :-1]], 1)
        a3 = torch.where(skip, torch.cat([ninf, ninf, alpha[:, :-2]], 1), ninf)
        alpha = torch.where(valid & (t < n_in), _lse3(alpha, a2, a3) + lp_ext[t], ninf)
        alphas.append(alpha)
    log_alpha = torch.stack(alphas, 1)  # (N, T, S)
    last_t = torch.tensor([max(v - 1, 0) for v in il], device=dev)
    at_end = log_alpha[torch.arange(N, device=dev), last_t]  # (N, S)
    end = torch.tensor([2 * v for v in tl], device=dev).unsqueeze(1)
    ll = at_end.gather(1, end).squeeze(1)
    ll_prev = at_end.gather(1, (end - 1).clamp(min=0)).squeeze(1)
    has_labels = torch.tensor(tl, device=dev) > 0
    ll = torch.logaddexp(ll, torch.where(has_labels, ll_prev, ninf.squeeze(1)))
    ll = torch.where(torch.tensor(il, device=dev) > 0, ll,
                     torch.where(has_labels, ninf.squeeze(1), torch.zeros_like(ll)))
    return -ll, log_alpha


def _ctc_loss_backward(grad, log_probs, targets, input_lengths, target_lengths, neg_log_likelihood, log_alpha,
                       blank, zero_infinity=False):
    il, tl, ext, valid, skip, lp_ext = _ctc_setup(log_probs, targets, input_lengths, target_lengths, blank)
    T, N, S = lp_ext.shape
    dev = log_probs.device
    ninf = torch.full((N, 1), float("-inf"), dtype=log_probs.dtype, device=dev)
    n_in = torch.tensor(il, device=dev).unsqueeze(1)
    s_pos = torch.arange(S, device=dev).unsqueeze(0)
    end = torch.tensor([2 * v for v in tl], device=dev).unsqueeze(1)
    last = valid & (s_pos >= end - 1) & (s_pos <= end)  # the two states a path may end in
    skip_next = torch.cat([skip[:, 2:], torch.zeros_like(skip[:, :2])], 1)  # s -> s + 2 allowed
    betas = [None] * T
    beta = ninf.expand(N, S)
    for t in range(T - 1, -1, -1):
        b2 = torch.cat([beta[:, 1:], ninf], 1)
        b3 = torch.where(skip_next, torch.cat([beta[:, 2:], ninf, ninf], 1), ninf)
        rec = _lse3(beta, b2, b3) + lp_ext[t]
        beta = torch.where(t == n_in - 1, torch.where(last, lp_ext[t], ninf),
                           torch.where(valid & (t < n_in - 1), rec, ninf))
        betas[t] = beta
    log_beta = torch.stack(betas, 0)  # (T, N, S)
    ab = log_alpha.transpose(0, 1) + log_beta  # (T, N, S)
    m = ab.amax(2, keepdim=True)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    summed = torch.zeros_like(log_probs).scatter_add(2, ext.unsqueeze(0).expand(T, N, S), torch.exp(ab - m))
    lcab = torch.log(summed) + m
    nll = neg_log_likelihood.view(1, N, 1)
    g = (torch.exp(log_probs) - torch.exp(lcab + nll - log_probs)) * grad.view(1, N, 1)
    keep = torch.arange(T, device=dev).view(T, 1, 1) < n_in.view(1, N, 1)
    if zero_infinity:
        keep = keep & ~torch.isinf(nll)
    return torch.where(keep, g, torch.zeros_like(g))


# Backward ops with no decomposition whose forward has one (grid_sample,
# bicubic upsampling): the vector-Jacobian product of PyTorch's own
# decomposition of the forward (torch._decomp), through torch.func.


def _grid_sampler_2d_backward(grad_output, input, grid, interpolation_mode, padding_mode, align_corners,
                              output_mask):
    from torch._decomp import decomposition_table

    forward = decomposition_table[torch.ops.aten.grid_sampler_2d.default]
    _, vjp = torch.func.vjp(lambda x, g: forward(x, g, interpolation_mode, padding_mode, align_corners), input, grid)
    grad_input, grad_grid = vjp(grad_output)
    return grad_input if output_mask[0] else None, grad_grid if output_mask[1] else None


def _upsample_bicubic2d_backward(grad_output, output_size, input_size, align_corners, scales_h=None,
                                 scales_w=None):
    # The CPU's kernel copies grad_output when the output has the input's
    # spatial size, even where a given scale made the forward resample.
    if list(input_size[2:]) == list(output_size):
        return grad_output.clone()
    # The forward is linear in its input: the VJP at zeros is the backward.
    from torch._decomp import decomposition_table

    forward = decomposition_table[torch.ops.aten.upsample_bicubic2d.default]
    _, vjp = torch.func.vjp(lambda x: forward(x, output_size, align_corners, scales_h, scales_w),
                            grad_output.new_zeros(input_size))
    return vjp(grad_output)[0]


def _grid_sampler_3d(input, grid, interpolation_mode=0, padding_mode=0, align_corners=False):
    """F.grid_sample on 5-d inputs (PyTorch has kernels only, no
    decomposition): trilinear (0) or nearest (1) sampling of input
    [N, C, D, H, W] at grid [N, oD, oH, oW, 3] = (x, y, z) in [-1, 1], with
    zeros (0), border (1) or reflection (2) padding, as the CPU kernel."""
    torch._check(interpolation_mode in (0, 1),
                 lambda: "grid_sampler(): bicubic interpolation only supports 4D input" if interpolation_mode == 2
                 else f"grid_sampler(): invalid interpolation mode {interpolation_mode}")
    torch._check(padding_mode in (0, 1, 2), lambda: f"grid_sampler(): invalid padding mode {padding_mode}")
    torch._check(input.dim() == 5 and grid.dim() == 5 and grid.shape[-1] == 3 and grid.shape[0] == input.shape[0],
                 lambda: f"grid_sampler(): expected a 5-D input and a 5-D grid [N, D, H, W, 3] with the input's "
                         f"batch size, got input {tuple(input.shape)} and grid {tuple(grid.shape)}")
    N, C, iD, iH, iW = input.shape

    def source(coord, size):
        # [-1, 1] -> [0, size - 1] (align_corners) or [-0.5, size - 0.5], then the padding rule
        c = ((coord + 1) * (size - 1) / 2) if align_corners else (((coord + 1) * size - 1) / 2)
        if padding_mode == 1:
            return c.clamp(0, size - 1)
        if padding_mode == 2:
            lo2, hi2 = (0, 2 * (size - 1)) if align_corners else (-1, 2 * size - 1)
            if lo2 == hi2:
                c = torch.zeros_like(c)
            else:
                lo, span = lo2 / 2, (hi2 - lo2) / 2
                d = (c - lo).abs()
                extra = torch.fmod(d, span)
                flips = (d / span).floor()
                c = torch.where(torch.fmod(flips, 2) == 0, extra + lo, span + lo - extra)
            return c.clamp(0, size - 1)
        return c

    ix, iy, iz = (source(grid[..., k], size) for k, size in enumerate((iW, iH, iD)))
    n_idx = torch.arange(N, device=input.device).view(N, 1, 1, 1, 1)
    c_idx = torch.arange(C, device=input.device).view(1, C, 1, 1, 1)

    def tap(x, y, z, w):
        """w * input at integer coordinates (x, y, z); 0 outside the volume."""
        inside = (x >= 0) & (x < iW) & (y >= 0) & (y < iH) & (z >= 0) & (z < iD)
        xi, yi, zi = (torch.where(inside, t, 0).to(torch.int64).unsqueeze(1) for t in (x, y, z))
        v = input[n_idx, c_idx, zi, yi, xi]
        return v * torch.where(inside, w, 0).unsqueeze(1).to(v.dtype)

    if interpolation_mode == 1:
        return tap(ix.round(), iy.round(), iz.round(), torch.ones_like(ix))
    x0, y0, z0 = ix.floor(), iy.floor(), iz.floor()
    x1, y1, z1 = x0 + 1, y0 + 1, z0 + 1
    out = None
    for z, wz in ((z0, z1 - iz), (z1, iz - z0)):
        for y, wy in ((y0, y1 - iy), (y1, iy - y0)):
            for x, wx in ((x0, x1 - ix), (x1, ix - x0)):
                t = tap(x, y, z, wx * wy * wz)
                out = t if out is None else out + t
    return out


def _grid_sampler_3d_backward(grad_output, input, grid, interpolation_mode, padding_mode, align_corners,
                              output_mask):
    _, vjp = torch.func.vjp(lambda x, g: _grid_sampler_3d(x, g, interpolation_mode, padding_mode, align_corners),
                            input, grid)
    grad_input, grad_grid = vjp(grad_output)
    return grad_input if output_mask[0] else None, grad_grid if output_mask[1] else None


def _kaiser_window(window_length, periodic=True, beta=12.0, *, dtype=None, layout=None, device=None,
                   pin_memory=None):
    """The CPU kernel (kaiser_window_stub): i0(beta sqrt|1 - ((n - a) / a)^2|) / i0(beta),
    a = (L - 1) / 2, in the dtype's opmath; periodic windows take L + 1
    points and drop the last."""
    dtype = dtype or torch.get_default_dtype()
    if window_length < 0:
        raise RuntimeError(f"kaiser_window requires non-negative window_length, got window_length={window_length}")
    if not dtype.is_floating_point:
        raise RuntimeError(f"kaiser_window expects floating point dtypes, got: {dtype}")
    if window_length <= 1:
        return torch.ones(window_length, dtype=dtype, device=device)
    n_pts = window_length + 1 if periodic else window_length
    ct = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    n = torch.arange(n_pts, dtype=dtype, device=device).to(ct)
    alpha = (n_pts - 1) / 2.0
    x = beta * torch.sqrt(torch.abs(1 - ((n - alpha) / alpha) ** 2))
    w = (torch.i0(x) / torch.i0(torch.full((), beta, dtype=ct, device=device))).to(dtype)
    return w[:window_length] if periodic else w


# ---- fake quantization (quantization-aware training) ----------------------
# PyTorch's CPU kernels (fake_quantize_tensor_cachemask_kernel and the
# per-channel one): q = zero_point + nearbyint(x * inv_scale), x * inv_scale
# in float32 with inv_scale = 1.0f / (float)scale; the mask says whether q
# lies in [quant_min, quant_max]; the output (clamp(q) - zero_point) * scale
# is computed in double and rounded once to x's dtype.  The backward
# (grad * mask) is PyTorch's own composite.

def _f32(v):
    return torch.tensor(v, dtype=torch.float32).item()


def _fake_quant(x, inv_scale, scale, zero_point, quant_min, quant_max):
    q = torch.round(x.float() * inv_scale) + zero_point  # round: half to even, as nearbyint
    mask = (q >= quant_min) & (q <= quant_max)
    out = (q.double().clamp(quant_min, quant_max) - zero_point) * scale
    return out.to(x.dtype), mask


def _check_quant_range(quant_min, quant_max):
    if quant_min > quant_max:
        raise RuntimeError("`quant_min` should be less than or equal to `quant_max`.")


def _fake_quantize_per_tensor_cachemask(x, scale, zero_point, quant_min, quant_max):
    _check_quant_range(quant_min, quant_max)
    if not quant_min <= zero_point <= quant_max:
        raise RuntimeError("`zero_point` must be between `quant_min` and `quant_max`.")
    sc = _f32(scale)
    return _fake_quant(x, _f32(1.0 / sc), sc, zero_point, quant_min, quant_max)


def _fake_quantize_per_tensor_cachemask_tensor_qparams(x, scale, zero_point, fake_quant_enabled, quant_min,
                                                       quant_max):
    """The form FakeQuantize modules call: scale and zero_point as tensors,
    fake_quant_enabled a 0/1 tensor (disabled: x itself, mask all true)."""
    _check_quant_range(quant_min, quant_max)
    sc = scale.reshape(()).float()
    zp = zero_point.reshape(()).to(torch.int64)
    out, mask = _fake_quant(x, 1.0 / sc, sc.double(), zp, quant_min, quant_max)
    on = fake_quant_enabled.reshape(()).to(x.device) != 0
    return torch.where(on, out, x), mask | ~on


def _fake_quantize_per_channel_cachemask(x, scale, zero_point, axis, quant_min, quant_max):
    _check_quant_range(quant_min, quant_max)
    if scale.dim() != 1 or zero_point.dim() != 1 or scale.numel() != x.shape[axis] or \
            zero_point.numel() != x.shape[axis]:
        raise RuntimeError("dimensions of scale and zero-point are not consistent with input tensor")
    shape = [1] * x.dim()
    shape[axis] = -1
    sc = scale.float().reshape(shape)
    zp = zero_point.reshape(shape)
    if not zp.is_floating_point():
        zp = zp.to(torch.int64)
    return _fake_quant(x, 1.0 / sc, sc.double(), zp, quant_min, quant_max)


def _fbgemm_qparams(mn, mx, quant_min, quant_max, preserve_sparsity):
    """fbgemm::ChooseQuantizationParams (which PyTorch's fused observer calls),
    elementwise over float32 min/max tensors: (scale float32, zero point)."""
    if preserve_sparsity:
        sqmin, sqmax = -((quant_max - quant_min) // 2 + 1), (quant_max - quant_min) // 2
        sym = (mn < 0) & (mx > 0)
        ms = torch.maximum((mn / sqmin).abs(), (mx / sqmax).abs()).double()
        mn = torch.where(sym, (ms * sqmin).float(), mn)
        mx = torch.where(sym, (ms * sqmax).float(), mx)
    mn, mx = mn.clamp(max=0.0), mx.clamp(min=0.0)
    scale = ((mx.double() - mn.double()) / (quant_max - quant_min)).float()
    scale = torch.where((scale == 0) | torch.isinf(1.0 / scale), torch.full_like(scale, 0.1), scale)
    s = scale.double()
    lo, hi = mn.double() / s, mx.double() / s
    z = torch.where(abs(quant_min) - lo.abs() < abs(quant_max) - hi.abs(), quant_min - lo, quant_max - hi)
    if preserve_sparsity:
        z = torch.where((mn < 0) & (mx > 0), torch.full_like(z, (quant_min + quant_max) / 2), z)
    z = torch.where(z < quant_min, quant_min, torch.where(z > quant_max, quant_max, torch.round(z)))
    return scale, z


def _fused_moving_avg_obs_fq_helper(x, observer_on, fake_quant_on, running_min, running_max, scale, zero_point,
                                    averaging_const, quant_min, quant_max, ch_axis, per_row_fake_quant=False,
                                    symmetric_quant=False):
    """The fused observer and fake quantization of PyTorch's default QAT
    qconfig (FusedMovingAvgObsFakeQuantize), as its CPU kernel: the running
    min/max move towards the batch's (taken as they are while still
    infinite), then scale and zero point follow them and x is fake-quantized
    per tensor or per row of ch_axis; both steps obey their 0/1 switches."""
    if ch_axis >= x.dim():
        raise RuntimeError("Error in fused_moving_avg_obs_fake_quant_cpu: ch_axis must be < self.dim()")
    if per_row_fake_quant:
        y = x if x.dim() == 2 else x.transpose(0, ch_axis).flatten(1)
        if running_min.numel() == 0:
            n = x.shape[ch_axis]
            running_min.resize_(n).fill_(math.inf)
            running_max.resize_(n).fill_(-math.inf)
            scale.resize_(n)
            zero_point.resize_(n)
        cur_min, cur_max = torch.aminmax(y, dim=1)
    else:
        cur_min, cur_max = torch.aminmax(x)
    observe, fake = observer_on.reshape(-1)[0] != 0, fake_quant_on.reshape(-1)[0] != 0
    a = _f32(averaging_const)
    for run, cur in ((running_min, cur_min), (running_max, cur_max)):
        moved = torch.where(torch.isinf(run), cur.to(run.dtype), run + a * (cur.to(run.dtype) - run))
        run.copy_(torch.where(observe, moved, run))
    sc, zp = _fbgemm_qparams(running_min.float(), running_max.float(), quant_min, quant_max, symmetric_quant)
    scale.copy_(torch.where(fake, sc.to(scale.dtype), scale))
    zero_point.copy_(torch.where(fake, zp.to(zero_point.dtype), zero_point))
    if not per_row_fake_quant:  # it obeys the switch itself
        return _fake_quantize_per_tensor_cachemask_tensor_qparams(x, scale, zero_point, fake.long(), quant_min,
                                                                  quant_max)
    out, mask = _fake_quantize_per_channel_cachemask(x, scale, zero_point, ch_axis, quant_min, quant_max)
    return torch.where(fake, out, x), mask | ~fake


KERNELS = {
    "aten::kaiser_window.beta": _kaiser_window,
    "aten::grid_sampler_3d": _grid_sampler_3d,
    "aten::grid_sampler_3d_backward": _grid_sampler_3d_backward,
    "aten::multilabel_margin_loss_forward": _multilabel_margin_loss_forward,
    "aten::grid_sampler_2d_backward": _grid_sampler_2d_backward,
    "aten::upsample_bicubic2d_backward": _upsample_bicubic2d_backward,
    "aten::_ctc_loss": _ctc_loss,
    "aten::_ctc_loss.Tensor": _ctc_loss,
    "aten::_ctc_loss_backward": _ctc_loss_backward,
    "aten::_ctc_loss_backward.Tensor": _ctc_loss_backward,
    "aten::mode": _mode,
    "aten::rrelu_with_noise": _rrelu_with_noise,
    "aten::rrelu_with_noise_": _rrelu_with_noise_,
    "aten::rrelu_with_noise_functional": _rrelu_with_noise_functional,
    "aten::_thnn_fused_lstm_cell": _lstm_cell,
    "aten::_thnn_fused_lstm_cell_backward_impl": _lstm_cell_backward,
    "aten::_thnn_fused_gru_cell": _gru_cell,
    "aten::_thnn_fused_gru_cell_backward": _gru_cell_backward,
    "aten::_amp_foreach_non_finite_check_and_unscale_": _amp_unscale,
    "aten::_amp_update_scale_": _amp_update_scale,
    "aten::_masked_softmax": _masked_softmax,
    "aten::_masked_softmax_backward": _masked_softmax_backward,
    "aten::_transform_bias_rescale_qkv": _transform_bias_rescale_qkv,
    "aten::_native_multi_head_attention": _native_multi_head_attention,
    "aten::_transformer_encoder_layer_fwd": _transformer_encoder_layer_fwd,
    "aten::_nested_tensor_from_mask_left_aligned": _nested_tensor_from_mask_left_aligned,
    "aten::_fused_adam_": _fused_adam,
    "aten::_fused_adam_.tensor_lr": _fused_adam,
    "aten::_fused_adamw_": _fused_adamw,
    "aten::_fused_adamw_.tensor_lr": _fused_adamw,
    "aten::_fused_sgd_": _fused_sgd,
    "aten::_fused_sgd_.tensor_lr": _fused_sgd,
    "aten::_fused_adagrad_": _fused_adagrad,
    "aten::_fused_adagrad_.tensor_lr": _fused_adagrad,
    "aten::fake_quantize_per_tensor_affine_cachemask": _fake_quantize_per_tensor_cachemask,
    "aten::_fake_quantize_per_tensor_affine_cachemask_tensor_qparams":
        _fake_quantize_per_tensor_cachemask_tensor_qparams,
    "aten::fake_quantize_per_channel_affine_cachemask": _fake_quantize_per_channel_cachemask,
    "aten::_fused_moving_avg_obs_fq_helper": _fused_moving_avg_obs_fq_helper,
}


# ---- autograd formulas computed in float64 -----------------------------------
# householder_product's backward is a long chain of float32 ops in PyTorch's
# formula; on an ill-conditioned input its rounding errors reached 3x the
# CPU's.  The forward lowering already computes in float64 (lower_linalg.c).
# When derivatives may be needed, the AutogradPrivateUse1 kernel below
# computes the product from differentiable float64 ops instead and rounds
# once, so autograd, forward AD, double backward and torch.func transforms
# all differentiate in float64.  Registered by _dispatch.install, so only
# tpu tensors take it.


def _householder_reference(A, tau):
    """Q = H_1 ... H_k applied to the first n columns of I, H_i = I - tau_i v_i v_i^H
    (LAPACK's orgqr), from differentiable tensor ops."""
    m, n = A.shape[-2:]
    Q = torch.eye(m, n, dtype=A.dtype, device=A.device).expand(*A.shape[:-2], m, n)
    if tau.shape[-1] == 0:  # Q = I, still a function of A (zero gradient), as PyTorch's formula gives
        return torch.where(torch.zeros_like(A, dtype=torch.bool), A, Q) + tau.sum(-1)[..., None, None].real * 0
    rows = torch.arange(m, device=A.device)
    for i in reversed(range(tau.shape[-1])):
        v = A[..., :, i]
        v = torch.where(rows < i, torch.zeros_like(v), torch.where(rows == i, torch.ones_like(v), v))
        Q = Q - tau[..., i, None, None] * v.unsqueeze(-1) * (v.conj().unsqueeze(-2) @ Q)
    return Q


def _may_differentiate(*ts):
    from torch.autograd import forward_ad

    return torch.is_grad_enabled() or any(forward_ad.unpack_dual(t).tangent is not None for t in ts)


def _householder_product(A, tau):
    if A.dim() >= 2 and tau.dim() >= 1 and _may_differentiate(A, tau):
        wide = torch.complex128 if A.is_complex() else torch.float64
        return _householder_reference(A.to(wide), tau.to(wide)).to(A.dtype)
    with torch._C._AutoDispatchBelowAutograd():
        return torch.ops.aten.linalg_householder_product(A, tau)


# Ops whose backward PyTorch has only as CPU/CUDA kernels (grid_sample,
# bicubic upsampling): when derivatives may be needed, the forward runs as
# differentiable tpu ops (PyTorch's decomposition, or ours for 3-d
# grid_sample) and autograd differentiates those.  This is also what makes
# them differentiable in compiled graphs: AOTAutograd traces through this
# kernel, and a backward computed with torch.func inside a traced graph
# cannot be.


def _differentiable_forward(name, forward):
    def kernel(*args, **kwargs):
        if _may_differentiate(*[a for a in args if isinstance(a, torch.Tensor)]):
            return forward()(*args, **kwargs)
        with torch._C._AutoDispatchBelowAutograd():
            return getattr(torch.ops.aten, name).default(*args, **kwargs)

    return kernel


class _ZeroGradOf(torch.autograd.Function):
    """out, linked to `src` with a zero gradient (nearest grid sampling: the
    CPU's backward returns zeros for the grid, not None)."""

    @staticmethod
    def forward(ctx, out, src):
        ctx.src_shape = src.shape
        return out.view_as(out)

    @staticmethod
    def backward(ctx, g):
        return g, g.new_zeros(ctx.src_shape)


def _grid_sampler(name, forward):
    def sample(input, grid, interpolation_mode, padding_mode, align_corners):
        out = forward()(input, grid, interpolation_mode, padding_mode, align_corners)
        return _ZeroGradOf.apply(out, grid) if interpolation_mode == 1 and grid.requires_grad else out

    return _differentiable_forward(name, lambda: sample)


def _torch_decomposition(name):
    def get():
        from torch._decomp import decomposition_table

        return decomposition_table[getattr(torch.ops.aten, name).default]

    return get


class _BicubicSameSize(torch.autograd.Function):
    """upsample_bicubic2d whose output has the input's spatial size: the
    forward resamples (with a given scale_factor it is no copy) but the CPU's
    backward kernel copies grad_output; forward AD applies the forward."""

    @staticmethod
    def forward(ctx, x, output_size, align_corners, scales_h, scales_w):
        ctx.args = (output_size, align_corners, scales_h, scales_w)
        with torch._C._AutoDispatchBelowAutograd():
            return torch.ops.aten.upsample_bicubic2d.default(x, *ctx.args)

    @staticmethod
    def backward(ctx, g):
        return g, None, None, None, None

    @staticmethod
    def jvp(ctx, x_t, *_):
        return torch.ops.aten.upsample_bicubic2d.default(x_t, *ctx.args)


_bicubic_forward = _differentiable_forward("upsample_bicubic2d", _torch_decomposition("upsample_bicubic2d"))


def _upsample_bicubic2d(input, output_size, align_corners, scales_h=None, scales_w=None):
    if _may_differentiate(input) and input.dim() == 4 and list(input.shape[2:]) == list(output_size):
        return _BicubicSameSize.apply(input, output_size, align_corners, scales_h, scales_w)
    return _bicubic_forward(input, output_size, align_corners, scales_h, scales_w)


class _ComplexAngle(torch.autograd.Function):
    """angle(z) of a complex z with PyTorch's gradient, grad * 1j * z / |z|^2
    (0 where z == 0), formed from real parts: tpu ops take no complex scalar
    such as the 1j of PyTorch's own formula."""

    @staticmethod
    def forward(ctx, z):
        ctx.save_for_backward(z)
        with torch._C._AutoDispatchBelowAutograd():
            return torch.ops.aten.angle.default(z)

    @staticmethod
    def backward(ctx, g):
        (z,) = ctx.saved_tensors
        x, y = z.real, z.imag
        r2 = x * x + y * y
        scale = torch.where(r2 == 0, torch.zeros_like(r2), g / r2)
        return torch.view_as_complex(torch.stack([-y * scale, x * scale], -1).contiguous())


def _angle(z):
    if _may_differentiate(z):
        if z.is_complex():
            return _ComplexAngle.apply(z)
        with torch._C._AutoDispatchBelowAutograd():
            out = torch.ops.aten.angle.default(z)
        return _ZeroGradOf.apply(out, z)  # real: 0 or pi, a zero gradient
    with torch._C._AutoDispatchBelowAutograd():
        return torch.ops.aten.angle.default(z)


class _MultilabelMargin(torch.autograd.Function):
    """multilabel_margin_loss_forward kept whole, with its backward op, as
    PyTorch's autograd formula has it.  PyTorch's Python decomposition, which
    tracing would run in its place (a py_impl kernel for Autograd), counts
    the targets after a row's first -1."""

    @staticmethod
    def forward(ctx, x, target, reduction):
        with torch._C._AutoDispatchBelowAutograd():
            loss, is_target = torch.ops.aten.multilabel_margin_loss_forward.default(x, target, reduction)
        ctx.save_for_backward(x, target, is_target)
        ctx.reduction = reduction
        ctx.mark_non_differentiable(is_target)
        return loss, is_target

    @staticmethod
    def backward(ctx, g, _):
        x, target, is_target = ctx.saved_tensors
        gx = torch.ops.aten.multilabel_margin_loss_backward.default(g, x, target, ctx.reduction, is_target)
        return gx, None, None


def _multilabel_margin(x, target, reduction):
    return _MultilabelMargin.apply(x, target, reduction)


AUTOGRAD = {
    "angle": _angle,
    "linalg_householder_product": _householder_product,
    "grid_sampler_2d": _grid_sampler("grid_sampler_2d", _torch_decomposition("grid_sampler_2d")),
    "grid_sampler_3d": _grid_sampler("grid_sampler_3d", lambda: _grid_sampler_3d),
    "upsample_bicubic2d": _upsample_bicubic2d,
    "multilabel_margin_loss_forward": _multilabel_margin,
}
