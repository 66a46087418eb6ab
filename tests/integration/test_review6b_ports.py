"""TF1 programs ported to dcf by changing the module prefix (`import dcf as tf`).

Each test is a small, realistic TF1 graph-mode program (the sources and their TF1 runs
are in the round-6 review notes), run under dcf and checked against values computed
independently: numpy re-implementations, closed forms, or constants from TF 2.21's
tf.compat.v1 (control flow v1), which say so where they appear.
"""

from __future__ import annotations

import os
import threading

import numpy as np

import dcf as tf

# ------------------------------------------------------------------ greedy decoder
B, V, E, H, EOS = 3, 5, 4, 6, 0


def _decoder_params(seed: int = 5) -> tuple:
    rng = np.random.RandomState(seed)
    emb = rng.randn(V, E).astype(np.float32)
    w_out = rng.randn(H, V).astype(np.float32)
    b_out = np.array([0.0, 0.2, 0.1, 0.0, 0.3], np.float32)
    cell_w = [rng.randn(E + H, 2 * H).astype(np.float32) * 0.7, np.ones(2 * H, np.float32),
              rng.randn(E + H, H).astype(np.float32) * 0.7, np.zeros(H, np.float32)]
    h0 = rng.randn(B, H).astype(np.float32)
    return emb, w_out, b_out, cell_w, h0


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _numpy_decoder(emb, w_out, b_out, cell_w, h0, start, maxlen):
    """The decoder below in numpy: steps, tokens [B, T], final h, and d(score)/d(w_out)
    (h does not depend on w_out: the argmax picks the tokens, so it is sum over active
    rows and steps of outer(h_new, onehot(argmax)))."""
    gk, gb, ck, cb = (w.astype(np.float64) for w in cell_w)
    tok, h = np.array(start), h0.astype(np.float64)
    done = np.zeros(B, bool)
    toks, d_w_out, t = [], np.zeros((H, V)), 0
    while not done.all() and t < maxlen:
        x = emb[tok].astype(np.float64)
        r, u = np.split(_sigmoid(np.concatenate([x, h], 1) @ gk + gb), 2, 1)
        c = np.tanh(np.concatenate([x, r * h], 1) @ ck + cb)
        h_new = u * h + (1 - u) * c
        logits = h_new @ w_out + b_out
        best = np.argmax(logits, 1)
        d_w_out += (h_new * ~done[:, None]).T @ np.eye(V)[best]
        nxt = np.where(done, EOS, best)
        h = np.where(done[:, None], h, h_new)
        toks.append(nxt)
        done |= nxt == EOS
        tok, t = nxt, t + 1
    return t, np.array(toks).T, h, d_w_out


def _decoder_graph(params, maxlen):
    emb_v, w_out_v, b_out_v, cell_w, _ = params
    emb = tf.Variable(emb_v, name="emb")
    w_out = tf.Variable(w_out_v, name="w_out")
    b_out = tf.Variable(b_out_v, name="b_out")
    cell = tf.nn.GRUCell(H)                     # TF1: tf.nn.rnn_cell.GRUCell
    start = tf.placeholder(tf.int32, [B], name="start")
    h0 = tf.placeholder(tf.float32, [B, H], name="h0")

    def cond(t, tok, h, done, ta, score):
        return tf.logical_not(tf.reduce_min(tf.cast(done, tf.int32)) > 0)

    def body(t, tok, h, done, ta, score):
        out, h_new = cell(tf.gather(emb, tok), h)
        logits = tf.matmul(out, w_out) + b_out
        score = score + tf.reduce_sum(tf.reduce_max(logits, axis=1)
                                      * (1.0 - tf.cast(done, tf.float32)))
        nxt = tf.cast(tf.argmax(logits, axis=1), tf.int32)
        nxt = tf.where(done, tf.fill([B], EOS), nxt)
        # TF1's where takes a [B] condition for [B, H] values (it picks rows); dcf's
        # broadcasts as numpy's, so the condition is [B, 1]
        h_new = tf.where(tf.expand_dims(done, 1), h, h_new)
        done = tf.logical_or(done, tf.equal(nxt, EOS))
        return [t + 1, nxt, h_new, done, ta.write(t, nxt), score]

    ta0 = tf.TensorArray(tf.int32, size=0, dynamic_size=True)
    t, _, h_fin, _, ta, score = tf.while_loop(
        cond, body, [tf.constant(0), start, h0, tf.zeros([B], tf.bool), ta0, tf.constant(0.0)],
        maximum_iterations=maxlen)
    tokens = tf.transpose(ta.stack())
    d_w_out = tf.gradients(score, w_out)[0]
    set_cell = [v.assign(w) for v, w in zip(cell.variables, cell_w)]
    return (start, h0), set_cell, (t, tokens, h_fin, d_w_out)


def test_greedy_gru_decoder_stops_rows_at_their_own_eos():
    params = _decoder_params()
    start_v = [1, 2, 3]
    for maxlen in (12, 5):             # all rows end on EOS (lengths 2, 8, 1); truncated
        g = tf.Graph()
        with g.as_default():
            (start, h0), set_cell, fetches = _decoder_graph(params, maxlen)
            init = tf.global_variables_initializer()
        with tf.Session(graph=g) as sess:
            sess.run(init)
            sess.run(set_cell)
            t, tokens, h_fin, d_w_out = sess.run(fetches, {start: start_v, h0: params[4]})
        want_t, want_tokens, want_h, want_d = _numpy_decoder(*params, start_v, maxlen)
        assert t == want_t == (9 if maxlen == 12 else 5)
        np.testing.assert_array_equal(tokens, want_tokens)
        np.testing.assert_allclose(h_fin, want_h, rtol=1e-5, atol=1e-6)
        # (was all zeros: the argmax feeding the bool `done` loop var cut the gradient)
        np.testing.assert_allclose(d_w_out, want_d, rtol=1e-5, atol=1e-5)
        assert np.abs(want_d).sum() > 1.0


def test_loop_gradient_passes_logits_that_an_argmax_also_reads():
    """The minimal form of the decoder's bug: logits feed both the loss and, through
    argmax, the bool loop var that masks the loss. TF1 gives 3 * x (d/dw of three
    iterations of sum(x * w), no row ever done); dcf gave zeros."""
    x_v = np.array([[1.0, 2.0], [3.0, -1.0]], np.float32)
    w = tf.Variable(np.array([[1.0, -2.0], [0.5, 3.0]], np.float32), name="w")
    x = tf.constant(x_v)

    def body(t, done, score):
        logits = x * w
        m = tf.reduce_sum(logits, axis=1) * (1.0 - tf.cast(done, tf.float32))
        done = tf.logical_or(done, tf.equal(tf.argmax(logits, axis=1), 7))
        return [t + 1, done, score + tf.reduce_sum(m)]

    _, _, s = tf.while_loop(lambda t, d, s: t < 3, body,
                            [tf.constant(0), tf.zeros([2], tf.bool), tf.constant(0.0)])
    grad = tf.gradients(s, w)[0]
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        s_v, g_v = sess.run([s, grad])
    assert s_v == -13.5                 # 3 * sum(x * w)
    np.testing.assert_array_equal(g_v, 3 * x_v)


# ---------------------------------------------------- MLP, Adam, Saver mid-way
N, D, HID, C = 64, 5, 16, 3


def _mlp_data() -> tuple:
    rng = np.random.RandomState(1)
    x = rng.randn(N, D)
    y = np.argmax(x[:, :C] + 0.3 * rng.randn(N, C), 1).astype(np.int32)
    return x, y, rng.randn(D, HID) * 0.3, rng.randn(HID, C) * 0.3


def _numpy_adam_losses(x, y, w1, w2, steps, lr=0.01, b1=0.9, b2=0.999, eps=1e-8):
    params = [w1.copy(), np.zeros(HID), w2.copy(), np.zeros(C)]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    losses = []
    for step in range(1, steps + 1):
        w1_, b1_, w2_, b2_ = params
        pre = x @ w1_ + b1_
        hid = np.maximum(pre, 0)
        logits = hid @ w2_ + b2_
        z = logits - logits.max(1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(1, keepdims=True))
        losses.append(-logp[np.arange(N), y].mean())
        d_logits = (np.exp(logp) - np.eye(C)[y]) / N
        d_hid = d_logits @ w2_.T * (pre > 0)
        grads = [x.T @ d_hid, d_hid.sum(0), hid.T @ d_logits, d_logits.sum(0)]
        lr_t = lr * np.sqrt(1 - b2 ** step) / (1 - b1 ** step)
        for k, gk in enumerate(grads):
            m[k] = b1 * m[k] + (1 - b1) * gk
            v[k] = b2 * v[k] + (1 - b2) * gk * gk
            params[k] = params[k] - lr_t * m[k] / (np.sqrt(v[k]) + eps)
    return np.array(losses)


def test_mlp_adam_training_with_saver_restore_midway(tmp_path):
    steps, save_at = 200, 100
    x_v, y_v, w1_v, w2_v = _mlp_data()
    x = tf.placeholder(tf.float64, [None, D], name="x")
    y = tf.placeholder(tf.int32, [None], name="y")
    w1 = tf.Variable(w1_v, name="w1")
    b1 = tf.Variable(tf.zeros([HID], tf.float64), name="b1")
    w2 = tf.Variable(w2_v, name="w2")
    b2 = tf.Variable(tf.zeros([C], tf.float64), name="b2")
    logits = tf.matmul(tf.nn.relu(tf.matmul(x, w1) + b1), w2) + b2
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y,
                                                                         logits=logits))
    train_op = tf.train.AdamOptimizer(0.01).minimize(loss)
    saver = tf.train.Saver()
    ckpt = os.path.join(str(tmp_path), "model.ckpt")
    feed = {x: x_v, y: y_v}
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        losses = []
        for step in range(steps):
            if step == save_at:
                saver.save(sess, ckpt)
            losses.append(sess.run([loss, train_op], feed)[0])
        saver.restore(sess, ckpt)            # Adam's moments and powers come back too
        again = [sess.run([loss, train_op], feed)[0] for _ in range(save_at, steps)]
    # (TF1's AdamOptimizer keeps beta1/beta2 as float32 constants, so its float64 losses
    # differ from these, the formula's, by about 1e-7 relative)
    np.testing.assert_allclose(losses, _numpy_adam_losses(x_v, y_v, w1_v, w2_v, steps),
                               rtol=1e-9)
    assert again == losses[save_at:]


# --------------------------------------------- scan (EMA) and map_fn with nested cond
def test_scan_ema_gradient_and_map_fn_nested_cond():
    xs_v = np.array([0.5, -1.0, 2.0, 0.25, 1.5, -0.75, 1.0])
    rows_v = np.array([[1.0, 2.0, 1.5], [3.0, -1.0, 0.5], [-2.0, 0.5, 0.25], [0.5, 0.1, 0.2]])
    w_v = np.array([0.5, -1.0, 2.0])
    decay = tf.placeholder(tf.float64, [], name="decay")
    xs = tf.placeholder(tf.float64, [None], name="xs")
    ema = tf.scan(lambda acc, x: decay * acc + (1.0 - decay) * x, xs,
                  initializer=tf.constant(0.0, tf.float64))
    ema_loss = tf.reduce_sum(tf.square(ema - xs))
    d_decay, d_xs = tf.gradients(ema_loss, [decay, xs])
    w = tf.Variable(w_v, name="w")
    rows = tf.placeholder(tf.float64, [None, 3], name="rows")

    def per_row(r):
        s = tf.reduce_sum(r * w)
        return tf.cond(s > 0.0,
                       lambda: tf.cond(r[0] > r[1], lambda: s * s, lambda: tf.exp(-s)),
                       lambda: -s)

    per = tf.map_fn(per_row, rows)
    d_w = tf.gradients(tf.reduce_sum(per), w)[0]
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        out = sess.run([ema, ema_loss, d_decay, d_xs, per, d_w],
                       {decay: 0.8, xs: xs_v, rows: rows_v})

    def numpy_ema(a, x):
        acc, res = 0.0, []
        for v in x:
            acc = a * acc + (1 - a) * v
            res.append(acc)
        return np.array(res)

    def numpy_loss(a, x):
        return np.sum((numpy_ema(a, x) - x) ** 2)

    e = numpy_ema(0.8, xs_v)
    np.testing.assert_allclose(out[0], e, rtol=1e-12)
    np.testing.assert_allclose(out[1], numpy_loss(0.8, xs_v), rtol=1e-12)
    h = 1e-6
    np.testing.assert_allclose(out[2], (numpy_loss(0.8 + h, xs_v) - numpy_loss(0.8 - h, xs_v))
                               / (2 * h), rtol=1e-7)
    fd_xs = [(numpy_loss(0.8, xs_v + h * np.eye(7)[k]) - numpy_loss(0.8, xs_v - h * np.eye(7)[k]))
             / (2 * h) for k in range(7)]
    np.testing.assert_allclose(out[3], fd_xs, rtol=1e-7)
    s = rows_v @ w_v                   # 1.5 (exp branch), 3.5 (square), -1 (neg), 0.55
    want_per = np.where(s > 0, np.where(rows_v[:, 0] > rows_v[:, 1], s * s, np.exp(-s)), -s)
    np.testing.assert_allclose(out[4], want_per, rtol=1e-12)
    ds = np.where(s > 0, np.where(rows_v[:, 0] > rows_v[:, 1], 2 * s, -np.exp(-s)), -1.0)
    np.testing.assert_allclose(out[5], ds @ rows_v, rtol=1e-12)


# ------------------------------------------------- REINFORCE with a py_func environment
class _Walk:
    """1-D walk: moves +1/-1, reward 1 on reaching +3, -0.1 a step; ends at +-3."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.RandomState(seed)
        self.pos = 0

    def reset(self):
        self.pos = 0
        return np.float32(self.pos)

    def step(self, p_right):
        right = self.rng.rand() < p_right
        self.pos += 1 if right else -1
        return (np.int32(right), np.float32(self.pos),
                np.float32(1.0 if self.pos >= 3 else -0.1), np.bool_(abs(self.pos) >= 3))


def _numpy_episode(env: _Walk, w: float, b: float) -> tuple:
    obs, total, gw, gb, steps = env.reset(), 0.0, 0.0, 0.0, 0
    done = False
    while not done:
        p = _sigmoid(np.float32(w) * obs + np.float32(b))
        a, obs2, r, done = env.step(p)
        gw += (a - p) * obs
        gb += (a - p)
        total += r
        obs, steps = obs2, steps + 1
    return steps, total, -total * gw, -total * gb


def test_reinforce_rollout_through_py_func_env():
    env = _Walk(seed=3)
    w = tf.Variable(np.float32(0.3), name="w")
    b = tf.Variable(np.float32(0.1), name="b")
    # TF1 code calls .set_shape([]) on py_func outputs; dcf documents a reshape
    obs0 = tf.reshape(tf.py_func(env.reset, [], tf.float32), [])

    def body(t, obs, done, logp_sum, ret):
        p = tf.sigmoid(w * obs + b)
        a, obs2, r, d = tf.py_func(env.step, [p], [tf.int32, tf.float32, tf.float32, tf.bool])
        a, obs2, r, d = [tf.reshape(v, []) for v in (a, obs2, r, d)]
        af = tf.cast(a, tf.float32)
        logp = af * tf.log(p) + (1.0 - af) * tf.log(1.0 - p)
        return [t + 1, obs2, d, logp_sum + logp, ret + r]

    t, _, _, logp_sum, ret = tf.while_loop(
        lambda t, obs, done, lp, ret: tf.logical_not(done), body,
        [tf.constant(0), obs0, tf.constant(False), tf.constant(0.0), tf.constant(0.0)],
        maximum_iterations=50)
    loss = -logp_sum * tf.stop_gradient(ret)
    grads = tf.gradients(loss, [w, b])
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        got = [sess.run([t, ret, grads[0], grads[1]]) for _ in range(3)]
    ref_env = _Walk(seed=3)
    want = [_numpy_episode(ref_env, 0.3, 0.1) for _ in range(3)]
    # TF1 gives the same episodes: steps 5, 5, 3; returns -0.5, 0.6, 0.8; d/dw 0.20525,
    # -0.30906, -0.85195; d/db -0.59020, -0.73980, -0.96652
    for (steps, r, gw, gb), (ws, wr, wgw, wgb) in zip(got, want):
        assert steps == ws
        np.testing.assert_allclose([r, gw, gb], [wr, wgw, wgb], rtol=1e-5, atol=1e-6)
    assert [s for s, *_ in got] == [5, 5, 3]


# ---------------------------------------------- FIFOQueue fed by a producer thread
def test_fifo_queue_producer_thread_and_training_consumer():
    n_batches, bs = 12, 4
    rng = np.random.RandomState(5)
    data = [(rng.randn(bs, 2).astype(np.float32), rng.randn(bs).astype(np.float32))
            for _ in range(n_batches)]
    q = tf.FIFOQueue(capacity=3, dtypes=[tf.float32, tf.float32], shapes=[[2], []])
    x_in = tf.placeholder(tf.float32, [bs, 2])
    y_in = tf.placeholder(tf.float32, [bs])
    enqueue = q.enqueue_many([x_in, y_in])
    close = q.close()
    xb, yb = q.dequeue_many(bs)
    w = tf.Variable(tf.zeros([2]), name="w")
    loss = tf.reduce_mean(tf.square(tf.reduce_sum(xb * w, axis=1) - yb))
    train = tf.train.GradientDescentOptimizer(0.1).minimize(loss)
    sess = tf.Session()
    sess.run(tf.global_variables_initializer())

    def produce():
        for xv, yv in data:
            sess.run(enqueue, {x_in: xv, y_in: yv})
        sess.run(close)

    producer = threading.Thread(target=produce)
    producer.start()
    losses = []
    try:
        while True:
            losses.append(sess.run([loss, train])[0])
    except tf.errors.OutOfRangeError:
        pass
    producer.join()
    w_final = sess.run(w)
    sess.close()
    wn, want = np.zeros(2, np.float32), []
    for xv, yv in data:
        err = xv @ wn - yv
        want.append(np.mean(err ** 2))
        wn = wn - np.float32(0.1) * (2.0 / bs) * (xv.T @ err)
    np.testing.assert_allclose(losses, want, rtol=1e-5)
    np.testing.assert_allclose(w_final, wn, rtol=1e-5)


# ------------------------------------------------------------ small port mismatches
def test_tf1_dtype_name_float_is_float32():
    """TF1 code writes tf.placeholder("float", ...): TF's "float" is float32 (numpy's is
    float64), as Python's `float` already is in dcf."""
    assert tf.placeholder("float", [None, 2]).dtype is tf.float32
    assert tf.as_dtype("float") is tf.as_dtype(float) is tf.float32
    assert tf.as_dtype("double") is tf.float64
    assert tf.as_dtype("half") is tf.float16
    x = tf.placeholder("float", [2])
    w = tf.Variable(np.ones(2, np.float32))
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        assert sess.run(x * w, {x: [1.5, 2.0]}).dtype == np.float32


def test_py_func_without_outputs_is_an_op_for_control_dependencies():
    """TF1 returns the Operation for Tout=[] (a logging side effect, say), so that it
    goes into control_dependencies; dcf returned a one-element list."""
    seen = []
    x = tf.constant(np.float32(2.0))
    log = tf.py_func(lambda v: seen.append(float(v)), [x], [])
    assert isinstance(log, tf.Operation)
    with tf.control_dependencies([log]):
        y = tf.identity(x * 3.0)
    with tf.Session() as sess:
        assert sess.run(y) == 6.0
        assert sess.run(log) is None
    assert seen == [2.0, 2.0]
