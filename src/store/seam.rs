//! What the crate's own tests reach inside a store and set in its builder (the hidden feature
//! `__whitebox`, which only the crate's tests and fuzz targets turn on; see CONTRIBUTING.md):
//! hooks, background steps run by hand, and settings beyond the checked ranges. Not part of
//! the API.

use super::*;
use crate::error::OpenError;
use crate::log::LogFile;
use crate::store::builder::Builder;

#[doc(hidden)]
impl Store {
    /// Runs `hook` once at the start of the next read, after its caller checked the poison.
    pub fn __before_next_read(&self, hook: impl FnOnce() + Send + 'static) {
        self.read_hook.arm(Box::new(hook));
    }

    /// Runs `hook` once between the next reserve's read and its submission to the writer.
    pub fn __before_next_submit(&self, hook: impl FnOnce() + Send + 'static) {
        self.submit_hook.arm(Box::new(hook));
    }

    /// How many async requests wait in the commit queue.
    pub fn __queued_async(&self) -> usize {
        self.committer.queued_async()
    }

    /// This owner's token floor: pending records below it were acquired by an earlier owner.
    pub fn __token_floor(&self) -> u64 {
        self.token_floor().0
    }

    /// Runs one step of the background work now (see [`Background`](crate::whitebox::Background)),
    /// in a store opened with [`Builder::__manual_background`](crate::Builder::__manual_background).
    pub fn __background(&self, step: crate::whitebox::Background) -> Result<(), Error> {
        self.committer
            .with_writer_as_is(|writer| writer.run_background(step))
    }

    /// The expiry windows that may have a records table (docs/format.md, "Windows").
    pub fn __windows(&self) -> usize {
        self.engine.windows.count()
    }

    /// Forgets every cached record, so the next reads go to redb.
    pub fn __clear_cache(&self) {
        self.engine.cache.clear();
    }

    /// Runs `hook` once on the thread of the next background checkpoint to start, just before
    /// its durable commit (a test holds the commit there to work while it is in progress). A
    /// checkpoint already started runs without it.
    pub fn __before_checkpoint_commit(&self, hook: impl FnOnce() + Send + 'static) {
        self.__before_checkpoint_commit_if(|_| true, hook);
    }

    /// [`__before_checkpoint_commit`](Store::__before_checkpoint_commit) for the first
    /// background checkpoint started from now on of which `which` holds; the ones before it
    /// run without the hook. So a test holds the checkpoint it means (say, the first to move
    /// the log's frames back to its first region) whatever number of checkpoints the
    /// machine's speed let run before it.
    pub fn __before_checkpoint_commit_if(
        &self,
        which: impl Fn(&crate::state::CheckpointStart) -> bool + Send + 'static,
        hook: impl FnOnce() + Send + 'static,
    ) {
        self.engine.checkpoint.arm(Box::new(which), Box::new(hook));
    }
}

/// What the crate's own tests set beyond the checked ranges (the hidden feature `__whitebox`,
/// which only the crate's tests and fuzz targets turn on; see CONTRIBUTING.md): small batches,
/// frames, queues and checkpoints, to reach limits quickly. Not part of the API.
#[doc(hidden)]
impl Builder {
    /// [`open_with_storage`](Builder::open_with_storage) without checking the settings.
    pub fn __open_unchecked(
        &self,
        db: impl redb::StorageBackend + Clone,
        log: impl LogFile + 'static,
    ) -> Result<Store, OpenError> {
        Store::open_with_storage(self, db, Arc::new(log))
    }

    /// The most bytes of records one batch takes.
    pub fn __batch_bytes(&mut self, bytes: usize) -> &mut Self {
        self.limits.batch_bytes = bytes;
        self
    }

    /// The largest log frame's payload.
    pub fn __frame_bytes(&mut self, bytes: usize) -> &mut Self {
        self.limits.frame_bytes = bytes;
        self
    }

    /// How many async requests may wait in the commit queue.
    pub fn __queued_async(&mut self, requests: usize) -> &mut Self {
        self.limits.queued_async = requests;
        self
    }

    /// Benchmarks only: [`open`](Builder::open) creates a store whose B-tree file is a plain
    /// redb file, without the checksummed page layer (`tree/pages.rs`), so the load
    /// generator measures the layer's cost against the same engine without it. Only a new
    /// store: opening an existing file this way is refused, and the file made is refused by
    /// every normal open (it has no page-file header), so it is never taken for a real store.
    pub fn __without_page_checksums(&mut self) -> &mut Self {
        self.page_checksums = false;
        self
    }

    /// The engine's background work runs only when the test asks for it, one step at a time
    /// ([`Store::__background`](crate::Store::__background)): no applier thread, no
    /// applier commit, drain, checkpoint or sweep between batches. So a test decides, from its
    /// seed, which background step runs between two operations. Every store has the same work
    /// to do otherwise; only who starts it and when differs.
    pub fn __manual_background(&mut self) -> &mut Self {
        self.manual_background = true;
        self
    }
}
