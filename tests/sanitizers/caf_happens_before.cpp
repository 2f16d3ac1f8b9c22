// ThreadSanitizer builds only: tells TSan about the orderings that libcaf's own, uninstrumented
// code guarantees. Debian's libcaf is not compiled with -fsanitize=thread, so TSan does not see
// the atomics of CAF's mailboxes and job queues: a message written by its sender and read by
// its receiver, or an actor's state touched by two scheduler threads one message after the
// other, would look like races in our code. This library interposes the libcaf functions where
// a message enters a mailbox and where the actor handles it, and annotates exactly CAF's
// documented guarantees (libcaf's own calls go through the PLT, so the dynamic linker routes
// them here; the real function is found with dlsym(RTLD_NEXT)):
//   - everything the sender did before enqueueing a message happens before its handler runs
//     (release at enqueue, acquire on the same mailbox element before it is handled);
//   - an actor handles one message at a time: a handler happens before the next handler of the
//     same actor, on whatever thread (release/acquire on the actor);
//   - what the spawning thread did before launching an actor happens before its behaviour is
//     made (release at launch, acquire at activation);
//   - a message is destroyed after it was enqueued, even when it was never handled (release at
//     enqueue, acquire in memory_managed::request_deletion, which every mailbox element's
//     disposal goes through);
//   - reference counts (actors' control blocks, messages) decrement with acquire-release, so
//     whatever a holder did before dropping its reference happens before the object dies;
//   - an actor's cleanup happens before its destruction, wherever its last reference goes;
//   - every actor counted as done happens before await_all_actors_done returns (release where
//     the registry's running count drops, acquire when the wait for a count ends);
//   - the scheduler's job queues belong to CAF: TSan ignores the accesses made while a job is
//     pushed (they call nothing of ours).
// The library is preloaded (LD_PRELOAD, by tsan_run.sh) so that it comes before libcaf in the
// dynamic linker's search order. Nothing else is annotated: shared state that our code touches from
// two actors, or from an actor and another thread, without a message between them is still reported
// (tests.sanitizers.racy_actor). The functions interposed live in libcaf_core and libcaf_io
// 0.17.6; a missing one stops the process with its name.
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <caf/actor_control_block.hpp>
#include <caf/actor_registry.hpp>
#include <caf/blocking_actor.hpp>
#include <caf/error.hpp>
#include <caf/intrusive/task_result.hpp>
#include <caf/mailbox_element.hpp>
#include <caf/ref_counted.hpp>
#include <caf/resumable.hpp>
#include <caf/scheduled_actor.hpp>
#include <caf/scoped_actor.hpp>
#include <cstdio>
#include <cstdlib>

// In libtsan, not declared by GCC 12's <sanitizer/tsan_interface.h>.
extern "C" void __tsan_ignore_thread_begin();
extern "C" void __tsan_ignore_thread_end();

namespace {

template <class Fn>
Fn real(const char* mangled) {
  void* p = dlsym(RTLD_NEXT, mangled);
  if (p == nullptr) {
    std::fprintf(stderr, "caf_happens_before: libcaf has no %s (not CAF 0.17.6?)\n", mangled);
    std::abort();
  }
  return reinterpret_cast<Fn>(p);
}

// Everything the sender did before enqueueing x happens before x is handled or destroyed
// (destruction goes through memory_managed::request_deletion, a base subobject of x).
void release_element(caf::mailbox_element* x) {
  if (x == nullptr) return;
  __tsan_release(x);
  __tsan_release(static_cast<caf::memory_managed*>(x));
}

}  // namespace

// The layout of scheduled_actor::mailbox_visitor and blocking_actor::mailbox_visitor
// (caf/scheduled_actor.hpp, caf/blocking_actor.hpp): the actor comes first. (Not in the anonymous
// namespace: the functions below taking it must have external linkage.)
struct VisitorHead {
  void* self;
};

#define AP_MANGLED(name) __asm__(name)

// caf::scheduled_actor::enqueue(mailbox_element_ptr, execution_unit*)
void ap_scheduled_enqueue(caf::scheduled_actor*, caf::mailbox_element_ptr, caf::execution_unit*)
    AP_MANGLED(
        "_ZN3caf15scheduled_actor7enqueueESt10unique_ptrINS_15mailbox_elementENS_"
        "6detail8disposerEEPNS_14execution_unitE");
void ap_scheduled_enqueue(caf::scheduled_actor* self, caf::mailbox_element_ptr x,
                          caf::execution_unit* eu) {
  using Fn = void (*)(caf::scheduled_actor*, caf::mailbox_element_ptr, caf::execution_unit*);
  static const Fn fn = real<Fn>(
      "_ZN3caf15scheduled_actor7enqueueESt10unique_ptrINS_15mailbox_elementENS_"
      "6detail8disposerEEPNS_14execution_unitE");
  release_element(x.get());
  fn(self, std::move(x), eu);
}

// caf::blocking_actor::enqueue(mailbox_element_ptr, execution_unit*)
void ap_blocking_enqueue(caf::blocking_actor*, caf::mailbox_element_ptr, caf::execution_unit*)
    AP_MANGLED(
        "_ZN3caf14blocking_actor7enqueueESt10unique_ptrINS_15mailbox_elementENS_"
        "6detail8disposerEEPNS_14execution_unitE");
void ap_blocking_enqueue(caf::blocking_actor* self, caf::mailbox_element_ptr x,
                         caf::execution_unit* eu) {
  using Fn = void (*)(caf::blocking_actor*, caf::mailbox_element_ptr, caf::execution_unit*);
  static const Fn fn = real<Fn>(
      "_ZN3caf14blocking_actor7enqueueESt10unique_ptrINS_15mailbox_elementENS_"
      "6detail8disposerEEPNS_14execution_unitE");
  release_element(x.get());
  fn(self, std::move(x), eu);
}

// caf::scheduled_actor::mailbox_visitor::operator()(mailbox_element&): one message handled
caf::intrusive::task_result ap_scheduled_visit(VisitorHead*, caf::mailbox_element&)
    AP_MANGLED("_ZN3caf15scheduled_actor15mailbox_visitorclERNS_15mailbox_elementE");
caf::intrusive::task_result ap_scheduled_visit(VisitorHead* visitor, caf::mailbox_element& x) {
  using Fn = caf::intrusive::task_result (*)(VisitorHead*, caf::mailbox_element&);
  static const Fn fn =
      real<Fn>("_ZN3caf15scheduled_actor15mailbox_visitorclERNS_15mailbox_elementE");
  __tsan_acquire(&x);
  __tsan_acquire(visitor->self);
  auto result = fn(visitor, x);
  __tsan_release(visitor->self);
  return result;
}

// caf::blocking_actor::mailbox_visitor::operator()(mailbox_element&)
caf::intrusive::task_result ap_blocking_visit(VisitorHead*, caf::mailbox_element&)
    AP_MANGLED("_ZN3caf14blocking_actor15mailbox_visitorclERNS_15mailbox_elementE");
caf::intrusive::task_result ap_blocking_visit(VisitorHead* visitor, caf::mailbox_element& x) {
  using Fn = caf::intrusive::task_result (*)(VisitorHead*, caf::mailbox_element&);
  static const Fn fn =
      real<Fn>("_ZN3caf14blocking_actor15mailbox_visitorclERNS_15mailbox_elementE");
  __tsan_acquire(&x);
  __tsan_acquire(visitor->self);
  auto result = fn(visitor, x);
  __tsan_release(visitor->self);
  return result;
}

// caf::scheduled_actor::launch(execution_unit*, bool, bool): the spawner's writes ...
void ap_scheduled_launch(caf::scheduled_actor*, caf::execution_unit*, bool, bool)
    AP_MANGLED("_ZN3caf15scheduled_actor6launchEPNS_14execution_unitEbb");
void ap_scheduled_launch(caf::scheduled_actor* self, caf::execution_unit* eu, bool lazy,
                         bool hide) {
  using Fn = void (*)(caf::scheduled_actor*, caf::execution_unit*, bool, bool);
  static const Fn fn = real<Fn>("_ZN3caf15scheduled_actor6launchEPNS_14execution_unitEbb");
  __tsan_release(self);
  fn(self, eu, lazy, hide);
}

// ... happen before caf::scheduled_actor::activate(execution_unit*) makes its behaviour
bool ap_scheduled_activate(caf::scheduled_actor*, caf::execution_unit*)
    AP_MANGLED("_ZN3caf15scheduled_actor8activateEPNS_14execution_unitE");
bool ap_scheduled_activate(caf::scheduled_actor* self, caf::execution_unit* eu) {
  using Fn = bool (*)(caf::scheduled_actor*, caf::execution_unit*);
  static const Fn fn = real<Fn>("_ZN3caf15scheduled_actor8activateEPNS_14execution_unitE");
  __tsan_acquire(self);
  bool result = fn(self, eu);
  __tsan_release(self);
  return result;
}

// caf::scheduled_actor::cleanup(error&&, execution_unit*): destroys what is left in the mailbox.
// Its mixins' cleanup (a subscriber's groups cleared) runs before it on the same thread; all of
// it happens before the actor is destroyed, wherever its last reference goes (release on its
// control block, which the last intrusive_ptr_release acquires: an actor system's destructor
// destroys its own actors on its thread after a scheduler thread finalized them).
void ap_scheduled_cleanup(caf::scheduled_actor*, caf::error&&, caf::execution_unit*)
    AP_MANGLED("_ZN3caf15scheduled_actor7cleanupEONS_5errorEPNS_14execution_unitE");
void ap_scheduled_cleanup(caf::scheduled_actor* self, caf::error&& reason,
                          caf::execution_unit* eu) {
  using Fn = void (*)(caf::scheduled_actor*, caf::error&&, caf::execution_unit*);
  static const Fn fn =
      real<Fn>("_ZN3caf15scheduled_actor7cleanupEONS_5errorEPNS_14execution_unitE");
  __tsan_acquire(self);
  fn(self, std::move(reason), eu);
  __tsan_release(caf::actor_control_block::from(self));
}

// caf::actor_registry::dec_running(): an actor leaves the running count from its cleanup, after
// its last handler; actor_system::await_all_actors_done (and blocking_actor's
// await_all_other_actors_done) return through await_running_count_equal once the count is
// reached, so everything the actors did happens before the waiter goes on (the count is an
// atomic inside libcaf, which TSan does not see).
void ap_dec_running(caf::actor_registry*) AP_MANGLED("_ZN3caf14actor_registry11dec_runningEv");
void ap_dec_running(caf::actor_registry* self) {
  using Fn = void (*)(caf::actor_registry*);
  static const Fn fn = real<Fn>("_ZN3caf14actor_registry11dec_runningEv");
  __tsan_release(self);
  fn(self);
}
void ap_await_running_count(const caf::actor_registry*, size_t)
    AP_MANGLED("_ZNK3caf14actor_registry25await_running_count_equalEm");
void ap_await_running_count(const caf::actor_registry* self, size_t expected) {
  using Fn = void (*)(const caf::actor_registry*, size_t);
  static const Fn fn = real<Fn>("_ZNK3caf14actor_registry25await_running_count_equalEm");
  fn(self, expected);
  __tsan_acquire(const_cast<caf::actor_registry*>(self));
}

// Reference counts: every decrement is an acquire-release read-modify-write on the count.
#define AP_DEREF(fn_name, type, mangled)                            \
  void fn_name(type) AP_MANGLED(mangled);                           \
  void fn_name(type x) {                                            \
    using Fn = void (*)(type);                                      \
    static const Fn fn = real<Fn>(mangled);                         \
    __tsan_acquire(const_cast<void*>(static_cast<const void*>(x))); \
    __tsan_release(const_cast<void*>(static_cast<const void*>(x))); \
    fn(x);                                                          \
  }

// caf::intrusive_ptr_release(actor_control_block*), caf::intrusive_ptr_release_weak(...)
AP_DEREF(ap_release_strong, caf::actor_control_block*,
         "_ZN3caf21intrusive_ptr_releaseEPNS_19actor_control_blockE")
AP_DEREF(ap_release_weak, caf::actor_control_block*,
         "_ZN3caf26intrusive_ptr_release_weakEPNS_19actor_control_blockE")
// caf::ref_counted::deref() const (messages, among others)
AP_DEREF(ap_ref_counted_deref, const caf::ref_counted*, "_ZNK3caf11ref_counted5derefEv")

// caf::memory_managed::request_deletion(bool) const: how a mailbox element is disposed of
void ap_request_deletion(const caf::memory_managed*, bool)
    AP_MANGLED("_ZNK3caf14memory_managed16request_deletionEb");
void ap_request_deletion(const caf::memory_managed* self, bool decremented_rc) {
  using Fn = void (*)(const caf::memory_managed*, bool);
  static const Fn fn = real<Fn>("_ZNK3caf14memory_managed16request_deletionEb");
  __tsan_acquire(const_cast<caf::memory_managed*>(self));
  fn(self, decremented_rc);
}

// The work-stealing scheduler's job queues (caf::scheduler::coordinator<work_stealing>::enqueue,
// worker<work_stealing>::exec_later): what these calls touch is CAF's own queue (a node it
// allocates here and frees on the worker that takes the job), guarded by spin locks TSan cannot
// see; they call nothing of ours, so TSan ignores the accesses made inside them. What the pusher
// did before happens before the job runs (release on the job here, acquire where it resumes).
#define AP_JOB_PUSH(fn_name, mangled)                       \
  void fn_name(void*, caf::resumable*) AP_MANGLED(mangled); \
  void fn_name(void* self, caf::resumable* job) {           \
    using Fn = void (*)(void*, caf::resumable*);            \
    static const Fn fn = real<Fn>(mangled);                 \
    __tsan_release(job);                                    \
    __tsan_ignore_thread_begin();                           \
    fn(self, job);                                          \
    __tsan_ignore_thread_end();                             \
  }
AP_JOB_PUSH(ap_coordinator_enqueue,
            "_ZN3caf9scheduler11coordinatorINS_6policy13work_stealingEE7enqueueEPNS_9resumableE")
// caf::scheduler::coordinator<work_stealing>::stop(): the actor system's destructor hands each
// worker a last job and joins it; by then every actor of ours is done (ActorEngine awaits them)
void ap_coordinator_stop(void*)
    AP_MANGLED("_ZN3caf9scheduler11coordinatorINS_6policy13work_stealingEE4stopEv");
void ap_coordinator_stop(void* self) {
  using Fn = void (*)(void*);
  static const Fn fn =
      real<Fn>("_ZN3caf9scheduler11coordinatorINS_6policy13work_stealingEE4stopEv");
  __tsan_ignore_thread_begin();
  fn(self);
  __tsan_ignore_thread_end();
}
AP_JOB_PUSH(ap_worker_exec_later,
            "_ZN3caf9scheduler6workerINS_6policy13work_stealingEE10exec_laterEPNS_9resumableE")

// caf::io::basp::worker::resume, entered through its resumable base (the non-virtual thunk the
// scheduler calls): a BASP worker deserializes the message the multiplexer copied into it
// before scheduling it.
caf::resumable::resume_result ap_basp_worker_resume(caf::resumable*, caf::execution_unit*, size_t)
    AP_MANGLED("_ZThn16_N3caf2io4basp6worker6resumeEPNS_14execution_unitEm");
caf::resumable::resume_result ap_basp_worker_resume(caf::resumable* job, caf::execution_unit* eu,
                                                    size_t max_throughput) {
  using Fn = caf::resumable::resume_result (*)(caf::resumable*, caf::execution_unit*, size_t);
  static const Fn fn = real<Fn>("_ZThn16_N3caf2io4basp6worker6resumeEPNS_14execution_unitEm");
  __tsan_acquire(job);
  return fn(job, eu, max_throughput);
}

// caf::scoped_actor::~scoped_actor(): the blocking actor behind a scoped_actor is cleaned up here
// (its subscriptions cleared, its references dropped) while scheduler threads may still hold
// references to it and run its last cleanup; the ordering between the two is CAF's (through
// the uninstrumented parts of its control block), and nothing of ours runs inside, so TSan
// ignores the accesses made during the destructor.
void ap_scoped_actor_dtor(caf::scoped_actor*) AP_MANGLED("_ZN3caf12scoped_actorD1Ev");
void ap_scoped_actor_dtor(caf::scoped_actor* self) {
  using Fn = void (*)(caf::scoped_actor*);
  static const Fn fn = real<Fn>("_ZN3caf12scoped_actorD1Ev");
  __tsan_ignore_thread_begin();
  fn(self);
  __tsan_ignore_thread_end();
}
