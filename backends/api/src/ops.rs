//! The operations of [`TorchComm`]: one checked method per row of the table
//! ([`torchcomms_core::for_each_op`]). Each checks its arguments (naming the operation, the
//! argument and what was expected), lowers the call onto a [`Call`] and hands it to the backend.

use torchcomms_core::ReduceOp;

use crate::call::Call;
use crate::comm::TorchComm;
use crate::error::Result;
use crate::options::OpOptions;
use crate::persistent::AllGatherP;
use crate::tensor::Tensor;
use crate::work::Work;

/// The API's type of each argument kind.
macro_rules! api_type {
    (Tensor) => {
        &Tensor
    };
    (Tensors) => {
        &[Tensor]
    };
    (Rank) => {
        usize
    };
    (ReduceOp) => {
        ReduceOp
    };
    (Splits) => {
        &[usize]
    };
    (Persistent) => {
        &AllGatherP
    };
}

macro_rules! api_methods {
    ($([$name:ident $id:literal [$($doc:literal)*] [$($arg:ident $kind:ident)*] $hook:tt [$c:ident $check:block] [$call:block]])*) => {
        impl TorchComm {
            $(
                $(#[doc = $doc])*
                #[allow(clippy::too_many_arguments, unused_variables)]
                pub fn $name(&self, $($arg: api_type!($kind),)* opts: &OpOptions) -> Result<Work> {
                    let $c = self.check(stringify!($name))?;
                    $check
                    let call: Call = $call;
                    self.run(call, opts)
                }
            )*
        }
    };
}

torchcomms_core::for_each_op!(api_methods);
