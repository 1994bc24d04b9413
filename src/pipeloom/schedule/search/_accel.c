/* Optional C accelerator of pipeloom's schedule core (private; pure-Python equivalents always exist).
 *
 * run_pass()       the greedy pass of pipeloom.schedule.search.greedy
 * proven_valid()   the validator's witness check (pipeloom.schedule.validate), see below
 *
 * run_pass() here is a line-by-line transcription of _greedy._run_pass_py (the pure-Python
 * reference, which stays the specification): the same candidates, the same decisions, the
 * same floating-point operations in the same order (built with -ffp-contract=off), and the
 * same event order (a min-heap of (time, device) pairs with stale entries skipped, as heapq).
 * tests/test_accel.py checks that both give identical job lists, orders, clocks and peaks.
 *
 * It exists for speed only: one pass over pp 64, m 512 (196 608 jobs) takes about 0.3 s in
 * Python and about 15 ms here. If the extension is not built, _greedy uses the Python pass.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    double t;
    int d;
} HItem;

typedef struct {
    HItem *v;
    Py_ssize_t n, cap;
} Heap;

static inline int hless(HItem x, HItem y) { return x.t < y.t || (x.t == y.t && x.d < y.d); }

static void sift_down(Heap *h, Py_ssize_t pos) { /* heapq._siftdown(heap, 0, pos) */
    HItem it = h->v[pos];
    while (pos > 0) {
        Py_ssize_t parent = (pos - 1) >> 1;
        if (hless(it, h->v[parent])) {
            h->v[pos] = h->v[parent];
            pos = parent;
        } else {
            break;
        }
    }
    h->v[pos] = it;
}

static void sift_up(Heap *h, Py_ssize_t pos) { /* heapq._siftup(heap, pos) */
    Py_ssize_t end = h->n, start = pos;
    HItem it = h->v[pos];
    Py_ssize_t child = 2 * pos + 1;
    while (child < end) {
        Py_ssize_t right = child + 1;
        if (right < end && !hless(h->v[child], h->v[right])) child = right;
        h->v[pos] = h->v[child];
        pos = child;
        child = 2 * pos + 1;
    }
    h->v[pos] = it;
    /* bubble it up from pos to start */
    while (pos > start) {
        Py_ssize_t parent = (pos - 1) >> 1;
        if (hless(it, h->v[parent])) {
            h->v[pos] = h->v[parent];
            pos = parent;
        } else {
            break;
        }
    }
    h->v[pos] = it;
}

static int heap_push(Heap *h, HItem it) {
    if (h->n == h->cap) {
        Py_ssize_t nc = h->cap * 2 + 16;
        HItem *nv = realloc(h->v, (size_t)nc * sizeof(HItem));
        if (!nv) return -1;
        h->v = nv;
        h->cap = nc;
    }
    h->v[h->n++] = it;
    sift_down(h, h->n - 1);
    return 0;
}

static HItem heap_pop(Heap *h) { /* caller checks n > 0 */
    HItem last = h->v[--h->n];
    if (h->n == 0) return last;
    HItem ret = h->v[0];
    h->v[0] = last;
    sift_up(h, 0);
    return ret;
}

static HItem heap_pushpop(Heap *h, HItem it) {
    if (h->n && hless(h->v[0], it)) {
        HItem ret = h->v[0];
        h->v[0] = it;
        sift_up(h, 0);
        return ret;
    }
    return it;
}

/* sequence of numbers -> freshly malloc'd C array of exactly n items (NULL + exception on error);
   one definition per element type: as_doubles (PyFloat_AsDouble) and as_longs (PyLong_AsLong) */
#define DEFINE_AS_ARRAY(NAME, TYPE, CONVERT)                                      \
    static TYPE *NAME(PyObject *seq, Py_ssize_t n, const char *what) {           \
        PyObject *fast = PySequence_Fast(seq, what);                              \
        if (!fast) return NULL;                                                   \
        if (PySequence_Fast_GET_SIZE(fast) != n) {                                \
            PyErr_Format(PyExc_ValueError, "%s: expected %zd values", what, n);   \
            Py_DECREF(fast);                                                      \
            return NULL;                                                          \
        }                                                                         \
        TYPE *out = malloc((size_t)(n ? n : 1) * sizeof(TYPE));                   \
        if (!out) {                                                               \
            Py_DECREF(fast);                                                      \
            PyErr_NoMemory();                                                     \
            return NULL;                                                          \
        }                                                                         \
        for (Py_ssize_t i = 0; i < n; i++) {                                      \
            out[i] = CONVERT(PySequence_Fast_GET_ITEM(fast, i));                  \
            if (out[i] == (TYPE)-1 && PyErr_Occurred()) {                         \
                free(out);                                                        \
                Py_DECREF(fast);                                                  \
                return NULL;                                                      \
            }                                                                     \
        }                                                                         \
        Py_DECREF(fast);                                                          \
        return out;                                                               \
    }

DEFINE_AS_ARRAY(as_doubles, double, PyFloat_AsDouble)
DEFINE_AS_ARRAY(as_longs, long, PyLong_AsLong)

static PyObject *list_of_doubles(const double *x, Py_ssize_t n) {
    PyObject *l = PyList_New(n);
    if (!l) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *f = PyFloat_FromDouble(x[i]);
        if (!f) {
            Py_DECREF(l);
            return NULL;
        }
        PyList_SET_ITEM(l, i, f);
    }
    return l;
}

/* run_pass(shape, chunk_arrays, device_arrays, policy, job_type, kinds)
 *   shape        = (pp, vpp, m, limit, eps)
 *   chunk_arrays = (dF, dB, dW, fcomm, bcomm, a, bfree, dev)            each of length nc = pp*vpp
 *   device_arrays= (first, capd, need, bord, ford)                       bord/ford: pp*vpp chunks
 *   policy       = (reserve, b_first, fill_always, lookahead, h_warm, warmup or -1)
 * -> None on deadlock, else (seqs, order_bytes, t, peak, start0)
 */
static PyObject *run_pass(PyObject *self, PyObject *args) {
    (void)self;
    int pp, vpp, m;
    double limit, eps;
    PyObject *o_dF, *o_dB, *o_dW, *o_fc, *o_bc, *o_a, *o_b, *o_dev;
    PyObject *o_first, *o_capd, *o_need, *o_bord, *o_ford;
    int reserve, b_first, fill_always, h_warm, warm;
    double look;
    PyObject *job_type, *kinds;
    if (!PyArg_ParseTuple(args, "(iiidd)(OOOOOOOO)(OOOOO)(pppdpi)OO", &pp, &vpp, &m, &limit, &eps, &o_dF, &o_dB,
                          &o_dW, &o_fc, &o_bc, &o_a, &o_b, &o_dev, &o_first, &o_capd, &o_need, &o_bord, &o_ford,
                          &reserve, &b_first, &fill_always, &look, &h_warm, &warm, &job_type, &kinds))
        return NULL;
    if (!PyType_Check(job_type) || !PyType_IsSubtype((PyTypeObject *)job_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "job_type must be a tuple subclass");
        return NULL;
    }
    if (!PyTuple_Check(kinds) || PyTuple_GET_SIZE(kinds) != 3) {
        PyErr_SetString(PyExc_TypeError, "kinds must be a 3-tuple (F, B, W)");
        return NULL;
    }
    if (pp < 1 || vpp < 1 || m < 1) {
        PyErr_SetString(PyExc_ValueError, "pp, vpp and m must be >= 1");
        return NULL;
    }
    const Py_ssize_t nc = (Py_ssize_t)pp * vpp;
    const Py_ssize_t per_dev = 3 * (Py_ssize_t)m * vpp; /* jobs each device runs */
    const Py_ssize_t total = per_dev * pp;
    const long last = (long)nc - 1;
    const double INF = HUGE_VAL;

    PyObject *result = NULL;
    double *dF = NULL, *dB = NULL, *dW = NULL, *fcomm = NULL, *bcomm = NULL, *a = NULL, *bfree = NULL;
    double *capd = NULL, *need = NULL;
    long *dev = NULL, *first = NULL, *bord = NULL, *ford = NULL;
    double *fe = NULL, *be = NULL, *t = NULL, *mem = NULL, *resv = NULL, *peak = NULL, *key = NULL,
           *start0 = NULL;
    long *nf = NULL, *nb = NULL, *nfwd = NULL, *started_b = NULL, *cnt = NULL;
    long *pend_mb = NULL, *pend_c = NULL, *ph = NULL, *pt = NULL;
    unsigned char *jk = NULL;
    long *jmb = NULL, *jc = NULL;
    int64_t *ord = NULL;
    PyObject **ints = NULL;
    Heap heap = {NULL, 0, 0};
    Py_ssize_t nints = (m > nc ? m : nc) + 1;

    if (!(dF = as_doubles(o_dF, nc, "dF")) || !(dB = as_doubles(o_dB, nc, "dB")) ||
        !(dW = as_doubles(o_dW, nc, "dW")) || !(fcomm = as_doubles(o_fc, nc, "fcomm")) ||
        !(bcomm = as_doubles(o_bc, nc, "bcomm")) || !(a = as_doubles(o_a, nc, "a")) ||
        !(bfree = as_doubles(o_b, nc, "b")) || !(dev = as_longs(o_dev, nc, "dev")) ||
        !(first = as_longs(o_first, pp, "first")) || !(capd = as_doubles(o_capd, pp, "capd")) ||
        !(need = as_doubles(o_need, pp, "need")) || !(bord = as_longs(o_bord, nc, "bord")) ||
        !(ford = as_longs(o_ford, nc, "ford")))
        goto done;
    for (Py_ssize_t i = 0; i < nc; i++) {
        if (dev[i] < 0 || dev[i] >= pp || bord[i] < 0 || bord[i] >= nc || ford[i] < 0 || ford[i] >= nc) {
            PyErr_SetString(PyExc_ValueError, "device or chunk index out of range");
            goto done;
        }
    }
    fe = malloc((size_t)nc * m * sizeof(double));
    be = malloc((size_t)nc * m * sizeof(double));
    t = calloc((size_t)pp, sizeof(double));
    mem = calloc((size_t)pp, sizeof(double));
    resv = calloc((size_t)pp, sizeof(double));
    peak = calloc((size_t)pp, sizeof(double));
    key = calloc((size_t)pp, sizeof(double));
    start0 = calloc((size_t)pp, sizeof(double));
    nf = calloc((size_t)nc, sizeof(long));
    nb = calloc((size_t)nc, sizeof(long));
    nfwd = calloc((size_t)pp, sizeof(long));
    started_b = calloc((size_t)pp, sizeof(long));
    cnt = calloc((size_t)pp, sizeof(long));
    pend_mb = malloc((size_t)pp * m * vpp * sizeof(long));
    pend_c = malloc((size_t)pp * m * vpp * sizeof(long));
    ph = calloc((size_t)pp, sizeof(long));
    pt = calloc((size_t)pp, sizeof(long));
    jk = malloc((size_t)total);
    jmb = malloc((size_t)total * sizeof(long));
    jc = malloc((size_t)total * sizeof(long));
    ord = malloc((size_t)total * sizeof(int64_t));
    heap.cap = pp + 16;
    heap.v = malloc((size_t)heap.cap * sizeof(HItem));
    if (!fe || !be || !t || !mem || !resv || !peak || !key || !start0 || !nf || !nb || !nfwd || !started_b ||
        !cnt || !pend_mb || !pend_c || !ph || !pt || !jk || !jmb || !jc || !ord || !heap.v) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < nc * m; i++) fe[i] = be[i] = -1.0;
    for (int d = 0; d < pp; d++) {
        heap.v[d].t = 0.0;
        heap.v[d].d = d;
    }
    heap.n = pp; /* sorted by device at time 0: already a heap */

    Py_ssize_t ncommit = 0;
    HItem item = heap_pop(&heap);
    for (;;) {
        double T = item.t;
        int d = item.d;
        if (T != key[d]) {
            if (!heap.n) break;
            item = heap_pop(&heap);
            continue;
        }
        /* ---- backward candidates */
        long bc = -1;
        double rb = INF;
        for (int j = 0; j < vpp; j++) {
            long c = bord[d * vpp + j];
            long mb = nb[c];
            if (mb >= nf[c]) continue;
            double r = fe[c * m + mb];
            if (c != last) {
                double e = be[(c + 1) * m + mb];
                if (e < 0) continue;
                e += bcomm[c];
                if (e > r) r = e;
            }
            if (r <= T) {
                bc = c;
                break;
            }
            if (r < rb) rb = r;
        }
        /* ---- forward candidates */
        long fc = -1;
        double rf = INF;
        int blocked = 0;
        if (bc < 0 || !b_first) {
            double md = mem[d];
            for (int j = 0; j < vpp; j++) {
                long c = ford[d * vpp + j];
                long mb = nf[c];
                if (mb >= m) continue;
                double r;
                if (c == 0) {
                    r = 0.0;
                } else {
                    r = fe[(c - 1) * m + mb];
                    if (r < 0) continue;
                    r += fcomm[c];
                }
                double ac = a[c];
                int ok;
                if (c == first[d]) {
                    if (warm >= 0 && !started_b[d] && nfwd[d] >= warm) continue;
                    if (reserve)
                        ok = resv[d] + need[d] <= limit;
                    else
                        ok = md + ac <= ((!h_warm || !started_b[d]) ? capd[d] : limit);
                } else {
                    ok = reserve || md + ac <= limit;
                }
                if (!ok) {
                    if (r <= T) blocked = 1;
                    continue;
                }
                if (r <= T) {
                    fc = c;
                    break;
                }
                if (r < rf) rf = r;
            }
        }
        int kind = -1;
        long c = -1;
        if (bc >= 0 && (b_first || fc < 0)) {
            kind = 1;
            c = bc;
        } else if (fc >= 0) {
            if (look > 0.0 && rb - T < look * dF[fc])
                rf = INF; /* hold the device for the coming B */
            else {
                kind = 0;
                c = fc;
            }
        }
        if (kind < 0) {
            int pw = ph[d] < pt[d];
            double nxt = rb < rf ? rb : rf;
            if (pw && (blocked || fill_always || nxt == INF ||
                       nxt - T >= dW[pend_c[(Py_ssize_t)d * m * vpp + ph[d]]] - eps)) {
                kind = 2;
            } else if (nxt < INF && nxt > T) {
                key[d] = nxt;
                HItem hi = {nxt, d};
                item = heap_pushpop(&heap, hi);
                continue;
            } else if (pw) {
                kind = 2;
            } else {
                key[d] = INF; /* sleep until a dependency is scheduled */
                if (!heap.n) break;
                item = heap_pop(&heap);
                continue;
            }
        }
        /* ---- commit */
        double e;
        long mb;
        if (kind == 0) {
            mb = nf[c];
            nf[c] = mb + 1;
            e = T + dF[c];
            fe[c * m + mb] = e;
            double md = mem[d] + a[c];
            mem[d] = md;
            if (md > peak[d]) peak[d] = md;
            if (reserve && c == first[d]) resv[d] += need[d];
            if (!started_b[d]) nfwd[d] += 1;
            if (c != last) {
                int d2 = (int)dev[c + 1];
                if (d2 != d) {
                    double k = e + fcomm[c + 1];
                    if (t[d2] > k) k = t[d2];
                    if (k < key[d2]) {
                        key[d2] = k;
                        HItem hi = {k, d2};
                        if (heap_push(&heap, hi) < 0) {
                            PyErr_NoMemory();
                            goto done;
                        }
                    }
                }
            }
        } else if (kind == 1) {
            mb = nb[c];
            nb[c] = mb + 1;
            e = T + dB[c];
            be[c * m + mb] = e;
            mem[d] -= bfree[c];
            resv[d] -= bfree[c];
            started_b[d] = 1;
            Py_ssize_t slot = (Py_ssize_t)d * m * vpp + pt[d];
            if (pt[d] >= (long)m * vpp) {
                PyErr_SetString(PyExc_RuntimeError, "internal error: W queue overflow");
                goto done;
            }
            pend_mb[slot] = mb;
            pend_c[slot] = c;
            pt[d] += 1;
            if (c) {
                int d2 = (int)dev[c - 1];
                if (d2 != d) {
                    double k = e + bcomm[c - 1];
                    if (t[d2] > k) k = t[d2];
                    if (k < key[d2]) {
                        key[d2] = k;
                        HItem hi = {k, d2};
                        if (heap_push(&heap, hi) < 0) {
                            PyErr_NoMemory();
                            goto done;
                        }
                    }
                }
            }
        } else {
            Py_ssize_t slot = (Py_ssize_t)d * m * vpp + ph[d];
            mb = pend_mb[slot];
            c = pend_c[slot];
            ph[d] += 1;
            e = T + dW[c];
            double fr = a[c] - bfree[c];
            mem[d] -= fr;
            resv[d] -= fr;
        }
        if (cnt[d] >= per_dev) {
            PyErr_SetString(PyExc_RuntimeError, "internal error: device job overflow");
            goto done;
        }
        if (!cnt[d]) start0[d] = T;
        Py_ssize_t at = (Py_ssize_t)d * per_dev + cnt[d];
        jk[at] = (unsigned char)kind;
        jmb[at] = mb;
        jc[at] = c;
        ord[at] = ncommit;
        cnt[d] += 1;
        ncommit += 1;
        t[d] = e;
        key[d] = e;
        HItem hi = {e, d};
        item = heap_pushpop(&heap, hi);
    }
    if (ncommit != total) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    /* ---- build (seqs, order_bytes, t, peak, start0); jobs are job_type(kind, mb, chunk) tuples */
    ints = calloc((size_t)nints, sizeof(PyObject *));
    if (!ints) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < nints; i++) {
        ints[i] = PyLong_FromSsize_t(i);
        if (!ints[i]) goto done;
    }
    PyTypeObject *jt = (PyTypeObject *)job_type;
    PyObject *seqs = PyList_New(pp);
    if (!seqs) goto done;
    for (int d = 0; d < pp; d++) {
        PyObject *lst = PyList_New(per_dev);
        if (!lst) {
            Py_DECREF(seqs);
            goto done;
        }
        PyList_SET_ITEM(seqs, d, lst);
        for (Py_ssize_t i = 0; i < per_dev; i++) {
            Py_ssize_t at = (Py_ssize_t)d * per_dev + i;
            PyObject *job = jt->tp_alloc(jt, 3);
            if (!job) {
                Py_DECREF(seqs);
                goto done;
            }
            PyObject *k = PyTuple_GET_ITEM(kinds, jk[at]);
            Py_INCREF(k);
            Py_INCREF(ints[jmb[at]]);
            Py_INCREF(ints[jc[at]]);
            PyTuple_SET_ITEM(job, 0, k);
            PyTuple_SET_ITEM(job, 1, ints[jmb[at]]);
            PyTuple_SET_ITEM(job, 2, ints[jc[at]]);
            /* (Kind member, int, int) can close no reference cycle: keep the 200k jobs out of the
               cyclic GC, as CPython does for tuples of atoms (else each collection walks them all) */
            PyObject_GC_UnTrack(job);
            PyList_SET_ITEM(lst, i, job);
        }
    }
    PyObject *ob = PyBytes_FromStringAndSize((const char *)ord, (Py_ssize_t)(total * sizeof(int64_t)));
    PyObject *lt = list_of_doubles(t, pp), *lp = list_of_doubles(peak, pp), *ls = list_of_doubles(start0, pp);
    if (!ob || !lt || !lp || !ls) {
        Py_XDECREF(ob);
        Py_XDECREF(lt);
        Py_XDECREF(lp);
        Py_XDECREF(ls);
        Py_DECREF(seqs);
        goto done;
    }
    result = Py_BuildValue("(NNNNN)", seqs, ob, lt, lp, ls);

done:
    if (ints) {
        for (Py_ssize_t i = 0; i < nints; i++) Py_XDECREF(ints[i]);
        free(ints);
    }
    free(dF); free(dB); free(dW); free(fcomm); free(bcomm); free(a); free(bfree); free(capd); free(need);
    free(dev); free(first); free(bord); free(ford);
    free(fe); free(be); free(t); free(mem); free(resv); free(peak); free(key); free(start0);
    free(nf); free(nb); free(nfwd); free(started_b); free(cnt);
    free(pend_mb); free(pend_c); free(ph); free(pt);
    free(jk); free(jmb); free(jc); free(ord); free(heap.v);
    return result;
}

/* ---------------------------------------------------------------- witness check
 * proven_valid(devices, witness, shape, home, kinds, a, b, limit) -> bool
 *   devices = per device a sequence of (kind, mb, chunk) tuples; witness = per device a sequence of
 *   int ranks (or an int64 buffer); shape = (pp, vpp, m); home[c] = device of chunk c;
 *   kinds = (F, B, W, BW) objects (compared by identity); a, b = per-chunk memory; limit = float
 *   or None (no memory check).
 * True only if: every job is in range and on its home device; each (mb, chunk) has one F and
 * either B and W or one BW, nothing twice; every dependency (F(mb,c-1) -> F(mb,c); F(mb,c) and
 * the input grad of (mb,c+1) -> B/BW(mb,c); B -> W) has a lower rank than its job; ranks rise
 * strictly along each device's list (so no deadlock is possible); the running memory of each
 * device (summed in list order, as memory_profile does) never exceeds limit + 1e-9.
 * Anything else, including an unexpected object, gives False (the caller then runs the
 * job-by-job checks, which produce the messages).
 */
static int rank_at(PyObject *w, Py_buffer *buf, int is_buf, Py_ssize_t i, long long *out) {
    if (is_buf) {
        *out = ((const long long *)buf->buf)[i];
        return 0;
    }
    long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(w, i));
    if (v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    *out = v;
    return 0;
}

static PyObject *proven_valid(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *devices, *witness, *o_home, *kinds, *o_a, *o_b, *o_limit;
    int pp, vpp, m;
    if (!PyArg_ParseTuple(args, "OO(iii)OOOOO", &devices, &witness, &pp, &vpp, &m, &o_home, &kinds, &o_a, &o_b,
                          &o_limit))
        return NULL;
    if (pp < 1 || vpp < 1 || m < 1 || !PyTuple_Check(kinds) || PyTuple_GET_SIZE(kinds) != 4) Py_RETURN_FALSE;
    const Py_ssize_t nc = (Py_ssize_t)pp * vpp, mnc = nc * m;
    int check_mem = o_limit != Py_None;
    double limit = 0.0;
    if (check_mem) {
        limit = PyFloat_AsDouble(o_limit);
        if (limit == -1.0 && PyErr_Occurred()) return NULL;
        limit += 1e-9;
    }
    int ok = 0;
    long *home = NULL;
    double *a = NULL, *b = NULL;
    long long *rk = NULL;
    PyObject *devs = NULL, *wits = NULL;
    if (!(home = as_longs(o_home, nc, "home")) || !(a = as_doubles(o_a, nc, "a")) || !(b = as_doubles(o_b, nc, "b")))
        goto fail;
    devs = PySequence_Fast(devices, "devices");
    wits = PySequence_Fast(witness, "witness");
    if (!devs || !wits) goto fail;
    if (PySequence_Fast_GET_SIZE(devs) != pp || PySequence_Fast_GET_SIZE(wits) != pp) goto done;
    if (check_mem && 0.0 > limit) goto done;
    rk = malloc((size_t)4 * mnc * sizeof(long long)); /* ranks of F, B, W, BW per (mb, chunk); -1 = absent */
    if (!rk) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < 4 * mnc; i++) rk[i] = -1;
    PyObject *kF = PyTuple_GET_ITEM(kinds, 0), *kB = PyTuple_GET_ITEM(kinds, 1), *kW = PyTuple_GET_ITEM(kinds, 2),
             *kBW = PyTuple_GET_ITEM(kinds, 3);
    for (int d = 0; d < pp; d++) {
        PyObject *seq = PySequence_Fast(PySequence_Fast_GET_ITEM(devs, d), "device list");
        if (!seq) goto fail;
        PyObject *wd = PySequence_Fast_GET_ITEM(wits, d);
        Py_buffer buf;
        int is_buf = 0;
        PyObject *wseq = NULL;
        if (PyObject_CheckBuffer(wd) && PyObject_GetBuffer(wd, &buf, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) == 0) {
            is_buf = 1;
            const char *f = buf.format ? buf.format : "B";
            if (*f == '@' || *f == '=' || *f == '<') f++;
            if (buf.itemsize != 8 || (strcmp(f, "q") != 0 && strcmp(f, "l") != 0)) {
                PyBuffer_Release(&buf);
                Py_DECREF(seq);
                goto done;
            }
        } else {
            PyErr_Clear();
            wseq = PySequence_Fast(wd, "witness list");
            if (!wseq) {
                PyErr_Clear();
                Py_DECREF(seq);
                goto done;
            }
        }
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        Py_ssize_t wn = is_buf ? buf.len / 8 : PySequence_Fast_GET_SIZE(wseq);
        int good = wn == n;
        long long prev = -1;
        double cur = 0.0;
        for (Py_ssize_t i = 0; good && i < n; i++) {
            PyObject *job = PySequence_Fast_GET_ITEM(seq, i);
            if (!PyTuple_Check(job) || PyTuple_GET_SIZE(job) != 3) {
                good = 0;
                break;
            }
            PyObject *k = PyTuple_GET_ITEM(job, 0);
            int ki = k == kF ? 0 : k == kB ? 1 : k == kW ? 2 : k == kBW ? 3 : -1;
            long mb = PyLong_AsLong(PyTuple_GET_ITEM(job, 1));
            long c = PyLong_AsLong(PyTuple_GET_ITEM(job, 2));
            if (PyErr_Occurred()) {
                PyErr_Clear();
                good = 0;
                break;
            }
            long long r;
            if (ki < 0 || mb < 0 || mb >= m || c < 0 || c >= nc || home[c] != d ||
                rank_at(wseq, &buf, is_buf, i, &r) < 0 || r <= prev) {
                good = 0;
                break;
            }
            prev = r;
            Py_ssize_t slot = (Py_ssize_t)ki * mnc + (Py_ssize_t)mb * nc + c;
            if (rk[slot] != -1) {
                good = 0;
                break;
            }
            rk[slot] = r;
            if (check_mem) {
                if (ki == 0)
                    cur += a[c];
                else if (ki == 1)
                    cur -= b[c];
                else if (ki == 2)
                    cur -= a[c] - b[c];
                else
                    cur -= a[c];
                if (cur > limit) good = 0;
            }
        }
        if (is_buf) PyBuffer_Release(&buf);
        Py_XDECREF(wseq);
        Py_DECREF(seq);
        if (!good) goto done;
    }
    const long long *rF = rk, *rB = rk + mnc, *rW = rk + 2 * mnc, *rBW = rk + 3 * mnc;
    for (Py_ssize_t s = 0; s < mnc; s++) {
        Py_ssize_t c = s % nc;
        if (rF[s] < 0) goto done;
        int split = rB[s] >= 0;
        if (split ? (rW[s] < 0 || rBW[s] >= 0 || rW[s] <= rB[s]) : (rBW[s] < 0 || rW[s] >= 0)) goto done;
        long long g = split ? rB[s] : rBW[s];
        if (g <= rF[s]) goto done;
        if (c > 0 && rF[s] <= rF[s - 1]) goto done;
        if (c < nc - 1) {
            long long g2 = rB[s + 1] >= 0 ? rB[s + 1] : rBW[s + 1];
            if (g <= g2) goto done;
        }
    }
    ok = 1;
done:
    free(home); free(a); free(b); free(rk);
    Py_XDECREF(devs);
    Py_XDECREF(wits);
    return PyBool_FromLong(ok);
fail:
    free(home); free(a); free(b); free(rk);
    Py_XDECREF(devs);
    Py_XDECREF(wits);
    return NULL;
}

static PyMethodDef methods[] = {
    {"run_pass", run_pass, METH_VARARGS, "One greedy pass (see pipeloom.schedule.search.greedy)."},
    {"proven_valid", proven_valid, METH_VARARGS, "The validator's witness check (see pipeloom.schedule.validate)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_accel", NULL, -1, methods};

PyMODINIT_FUNC PyInit__accel(void) { return PyModule_Create(&module); }
