// The fence gate's helpers, one text for both GPUs (Metal and CUDA): the arrival, the release
// spins, the reduction. Written in the primitives that each language's prelude defines
// (fastcoll/metal/prelude.h, fastcoll/cuda/prelude.h), after the control page's defines
// (fastcoll/gate/protocol/layout.py). fastcoll/gate/device/kernels.py puts it, as text, at the end of the header of
// each kernel that names it; the kernel bodies are fc_gate.inc and fc_mark.inc beside it.
//
// The load-bearing properties (docs/gate.md): every access to the control page is system scope;
// one thread of one threadgroup spins, with no backoff and no chunking; FASTCOLL_FENCE_MAX_ITERS
// bounds the spin as a backstop only, since the host stores RELEASE on every failure path. The
// FC_DIRECT paths (the direct mode, fastcoll/gate/host/direct_mode.py) are compiled only where the
// control page's defines set FC_DIRECT to 1.

// All-ones bytes into out: NaN in every float type.
template <typename T>
FC_DEVICE void fc_poison(FC_OUT T* dst, fc_uint n, fc_uint tid, fc_uint nthreads) {
  FC_OUT unsigned char* d = (FC_OUT unsigned char*)(dst);
  for (fc_uint i = tid; i < n; i += nthreads) {
    d[i] = 0xFF;
  }
}

// The first gate that failed on the GPU (a spin timeout, a signature mismatch), for the host.
FC_DEVICE void fc_record_failure(fc_words_t words, fc_uint seq, fc_uint status, fc_uint peer) {
  fc_store_relaxed(words + FC_SPIN_FAILED_SEQ, seq);
  fc_store_relaxed(words + FC_SPIN_FAILED_PEER, peer);
  fc_store(words + FC_SPIN_FAILED, status);
}

// The release spin: one thread, no backoff and no chunking. Each iteration is one system-scope
// acquire load of RELEASE, compared wrap-aware as in fastcoll/gate/protocol/seq.py; max_iters
// (FASTCOLL_FENCE_MAX_ITERS) bounds it as a backstop only, since the host stores RELEASE on every
// failure path. A gate whose predecessor failed (prev, from the token chain) does not wait: after
// a spin timeout the host is gone or stuck. Writes SPIN_ITERS and ACK (relaxed: for the profile),
// and SPIN_FAILED once the bound is hit.
FC_DEVICE fc_uint fc_spin(fc_words_t words, fc_uint seq, fc_uint prev, fc_uint max_iters) {
  fc_uint status = prev;
  fc_uint iters = 0;
  if (status == FC_OK) {
    while ((int)(fc_load(words + FC_RELEASE) - seq) < 0) {
      if (++iters >= max_iters) {
        status = FC_TIMEOUT;
        fc_record_failure(words, seq, status, FC_RANK);
        break;
      }
    }
  }
  fc_store_relaxed(words + FC_SPIN_ITERS, iters);
  fc_store_relaxed(words + FC_ACK, seq);
  return status;
}

#if FC_DIRECT
// The direct mode (ranks of one host: fastcoll/gate/host/direct_mode.py). Every rank's GPU writes its x
// into the gather segment and raises its FLAG there; nobody's host moves a byte per gate.

// Rank p's line in the gather segment.
FC_DEVICE fc_words_t fc_line(fc_bytes_t gather, fc_uint p) {
  return (fc_words_t)(gather + p * FC_G_LINE_BYTES);
}

// The direct mode's spin: one thread, no backoff and no chunking, as fc_spin, but it waits for
// every rank's FLAG to reach seq (one system-scope acquire load per iteration); RELEASE now only
// ends the wait early, stored by the host on failure (a peer lost, a timeout). Then every rank's
// signature of this gate must be this rank's: a rank that called another collective is a
// mismatch, never data.
FC_DEVICE fc_uint fc_spin_direct(fc_words_t words, fc_bytes_t gather, fc_uint seq, fc_uint prev, fc_uint sig,
                                 fc_uint max_iters) {
  fc_uint status = prev;
  fc_uint iters = 0;
  fc_uint p = 0;
  if (status == FC_OK) {
    while (p < FC_RANKS) {
      if ((int)(fc_load(fc_line(gather, p) + FC_G_FLAG) - seq) >= 0) {
        ++p;
      } else if ((int)(fc_load(words + FC_RELEASE) - seq) >= 0) {
        status = fc_load(words + FC_STATUS);  // the host gave up on this gate, and says why
        status = status == FC_OK ? FC_ERROR : status;
        break;
      } else if (++iters >= max_iters) {
        status = FC_TIMEOUT;
        fc_record_failure(words, seq, status, p);
        break;
      }
    }
  }
  if (status == FC_OK) {
    // Every rank's signature loaded before any is compared, so that the loads are in flight
    // together: one bus round trip, not one a rank.
    fc_uint sigs[FC_RANKS];
    for (p = 0; p < FC_RANKS; ++p) {
      sigs[p] = fc_load_relaxed(fc_line(gather, p) + FC_G_SIG + (seq & 1u));
    }
    for (p = 0; p < FC_RANKS; ++p) {
      if (sigs[p] != sig) {
        status = FC_MISMATCH;
        fc_record_failure(words, seq, status, p);
        break;
      }
    }
  }
  fc_store_relaxed(words + FC_SPIN_ITERS, iters);
  fc_store_relaxed(words + FC_ACK, seq);
  return status;
}
#endif

// Where gate seq's slots are (every rank's x, rank p's at p * its size): the receive mailbox
// the host fills, or in the direct mode the gather segment's set of seq's parity.
FC_DEVICE fc_bytes_t fc_slots(fc_words_t words, fc_uint seq) {
#if FC_DIRECT
  return fc_at(FC_GATHER_AT) + FC_G_HEADER + (seq & 1u) * FC_G_SET_BYTES;
#else
  return FC_BYTES(words) + FC_RECV_OFFSET;
#endif
}

// Where this rank's GPU puts x for gate seq: the send mailbox, or its own slot.
FC_DEVICE fc_bytes_t fc_own_slot(fc_words_t words, fc_uint seq, fc_uint nbytes) {
#if FC_DIRECT
  return fc_slots(words, seq) + FC_RANK * nbytes;
#else
  return FC_BYTES(words) + FC_SEND_OFFSET;
#endif
}

// Publish this rank's arrival at gate seq with system-scope release stores, once x is in its
// slot: in the direct mode the gate's signature and FLAG in this rank's line of the gather
// segment (ARRIVAL too, for the watcher only: the peers read FLAG), else ARRIVAL for the host.
FC_DEVICE void fc_arrive(fc_words_t words, fc_uint seq, fc_uint sig) {
#if FC_DIRECT
  fc_words_t line = fc_line(fc_at(FC_GATHER_AT), FC_RANK);
  fc_store_relaxed(line + FC_G_SIG + (seq & 1u), sig);
  fc_store(line + FC_G_FLAG, seq);
  fc_store_relaxed(words + FC_ARRIVAL, seq);
#else
  fc_store(words + FC_ARRIVAL, seq);
#endif
}

// The spin of either mode: the gate's status as the spin found it (FC_OK once released).
FC_DEVICE fc_uint fc_wait(fc_words_t words, fc_uint seq, fc_uint prev, fc_uint sig, fc_uint max_iters) {
#if FC_DIRECT
  return fc_spin_direct(words, fc_at(FC_GATHER_AT), seq, prev, sig, max_iters);
#else
  return fc_spin(words, seq, prev, max_iters);
#endif
}

// The host's STATUS of a gate whose spin ended in FC_OK, read by the spinning thread alone (every
// thread loading a control word would be a bus round trip each: these loads do not coalesce;
// bench/NOTES.md, entry 26). A relaxed load suffices: it follows that thread's acquire load of
// RELEASE (or of the last FLAG), after which the host's STATUS store is visible; and it orders
// nothing, so the slots' loads that follow it are in flight beside it (bench/NOTES.md, entry 72).
FC_DEVICE fc_uint fc_host_status(fc_words_t words) {
  return fc_load_relaxed(words + FC_STATUS);
}

// How many elements of every slot one thread loads before it combines them: as many as keep
// FC_RANKS * FC_REDUCE_BATCH values in its registers at 32, so that an 8 KiB bfloat16 x on two
// ranks is one pass of 256 threads (one bus round trip rather than two).
#define FC_REDUCE_BATCH (FC_RANKS >= 32 ? 1 : 32 / FC_RANKS)

// The reduction ops, one specialization each: its operator() is one step of the reduction as the
// host path computes it (fastcoll/dtypes.py), in float, the result rounded to the dtype by the
// caller after every rank. An op without one (an entry of fastcoll/dtypes.py's REDUCTIONS that
// says gate=True, with no kernel here) is an incomplete type in fc_apply, so its kernel does not
// compile rather than fall through to a sum; fastcoll/gate/device/kernels.py refuses it at import
// already. (No static_assert: its message would be the sources' one string literal, which
// kernels.minified does not allow.)
template <int OP>
struct fastcoll_gpu_implements_op;
template <>
struct fastcoll_gpu_implements_op<FC_OP_SUM> {
  FC_DEVICE float operator()(float a, float b) const { return a + b; }
};
template <>
struct fastcoll_gpu_implements_op<FC_OP_PROD> {
  FC_DEVICE float operator()(float a, float b) const { return a * b; }
};
// min and max propagate NaN as numpy's minimum and maximum do.
template <>
struct fastcoll_gpu_implements_op<FC_OP_MIN> {
  FC_DEVICE float operator()(float a, float b) const { return (a < b || a != a) ? a : b; }
};
template <>
struct fastcoll_gpu_implements_op<FC_OP_MAX> {
  FC_DEVICE float operator()(float a, float b) const { return (a > b || a != a) ? a : b; }
};
// mean sums; fc_reduce divides by FC_RANKS once every rank is in.
template <>
struct fastcoll_gpu_implements_op<FC_OP_MEAN> {
  FC_DEVICE float operator()(float a, float b) const { return a + b; }
};

// One step of the reduction by op OP.
template <int OP>
FC_DEVICE float fc_apply(float a, float b) {
  return fastcoll_gpu_implements_op<OP>()(a, b);
}

// out[i] = the reduction of element i over the receive mailbox's FC_RANKS slots (slot p holds
// rank p's x, COUNT elements of T each, back to back), combined in rank order on every rank so
// that every rank gets the same bits, as thread tid of nthreads. Each thread loads BATCH
// elements of every slot before it combines them: the mailbox is in host memory, where each load
// is a bus round trip, so the loads must be in flight together.
template <typename T, int OP, int COUNT, int BATCH>
FC_DEVICE void fc_reduce(FC_OUT T* out, fc_bytes_t recv, fc_uint tid, fc_uint nthreads) {
  for (fc_uint first = tid; first < (fc_uint)COUNT; first += BATCH * nthreads) {
    T w[FC_RANKS][BATCH];
    for (fc_uint p = 0; p < FC_RANKS; ++p) {
      for (fc_uint k = 0; k < BATCH; ++k) {
        const fc_uint i = first + k * nthreads;
        if (i < (fc_uint)COUNT) {
          w[p][k] = fc_mailbox_at<T>(recv + p * (COUNT * sizeof(T)), i);
        }
      }
    }
    for (fc_uint k = 0; k < BATCH; ++k) {
      const fc_uint i = first + k * nthreads;
      if (i < (fc_uint)COUNT) {
        float acc = (float)(w[0][k]);
        for (fc_uint p = 1; p < FC_RANKS; ++p) {
          acc = (float)((T)(fc_apply<OP>(acc, (float)(w[p][k]))));
        }
        if (OP == FC_OP_MEAN) {
          acc = fc_div(acc, (float)(FC_RANKS));
        }
        out[i] = (T)(acc);
      }
    }
  }
}
