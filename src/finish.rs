//! [`FinishOnDrop`]: a call that is never cut short, even when its caller's future is dropped.

use std::future::Future;
use std::pin::Pin;

/// A boxed backend call, owned by whoever polls it.
pub(crate) type BoxCall<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// A future polled by its caller that is never cut short: if the caller's future is dropped
/// before it completed, it is moved to a task of its own and finished there (its output is then
/// dropped: it must do its own bookkeeping).
pub(crate) struct FinishOnDrop<T: Send + 'static> {
    call: Option<BoxCall<T>>,
    runtime: tokio::runtime::Handle,
}

impl<T: Send + 'static> FinishOnDrop<T> {
    pub(crate) fn new(
        runtime: &tokio::runtime::Handle,
        call: impl Future<Output = T> + Send + 'static,
    ) -> Self {
        Self {
            call: Some(Box::pin(call)),
            runtime: runtime.clone(),
        }
    }
}

impl<T: Send + 'static> Future for FinishOnDrop<T> {
    type Output = T;

    fn poll(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<T> {
        let this = self.get_mut();
        let call = this.call.as_mut().expect("polled after completion");
        let output = std::task::ready!(call.as_mut().poll(cx));
        this.call = None;
        std::task::Poll::Ready(output)
    }
}

impl<T: Send + 'static> Drop for FinishOnDrop<T> {
    fn drop(&mut self) {
        if let Some(call) = self.call.take() {
            self.runtime.spawn(async move {
                call.await;
            });
        }
    }
}
