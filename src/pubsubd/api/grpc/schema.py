"""google.pubsub.v1.SchemaService servicer: schemas and their revisions, over the catalog's
schema registry (control/schemas.py).

Every call first applies what other processes wrote before it (``Catalog.caught_up``), so a
client reads its own writes back through whichever process of a cluster answers.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import grpc

from pubsubd.api.grpc.status import rpc, unary_method
from pubsubd.control.catalog import Catalog
from pubsubd.core import pb

Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"


class SchemaServicer:
    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.schemas = catalog.schemas

    @rpc
    async def CreateSchema(self, request: Any, context: Context) -> Any:
        await self.catalog.caught_up()
        return self.schemas.create(request.parent, request.schema_id, request.schema)

    @rpc
    async def GetSchema(self, request: Any, context: Context) -> Any:
        await self.catalog.caught_up()
        return self.schemas.get(request.name, request.view)

    @rpc
    async def ListSchemas(self, request: Any, context: Context) -> Any:
        await self.catalog.caught_up()
        schemas, token = self.schemas.list_schemas(
            request.parent, request.view, request.page_size, request.page_token
        )
        return pb.ListSchemasResponse(schemas=schemas, next_page_token=token)

    @rpc
    async def ListSchemaRevisions(self, request: Any, context: Context) -> Any:
        await self.catalog.caught_up()
        schemas, token = self.schemas.list_revisions(
            request.name, request.view, request.page_size, request.page_token
        )
        return pb.ListSchemaRevisionsResponse(schemas=schemas, next_page_token=token)

    @rpc
    async def CommitSchema(self, request: Any, context: Context) -> Any:
        await self.catalog.caught_up()
        return self.schemas.commit(request.name, request.schema)

    @rpc
    async def RollbackSchema(self, request: Any, context: Context) -> Any:
        await self.catalog.caught_up()
        return self.schemas.rollback(request.name, request.revision_id)

    @rpc
    async def DeleteSchemaRevision(self, request: Any, context: Context) -> Any:
        await self.catalog.caught_up()
        return self.schemas.delete_revision(request.name, request.revision_id)

    @rpc
    async def DeleteSchema(self, request: Any, context: Context) -> Any:
        await self.catalog.caught_up()
        self.schemas.delete(request.name)
        return pb.Empty()

    @rpc
    async def ValidateSchema(self, request: Any, context: Context) -> Any:
        self.schemas.validate_schema(request.parent, request.schema)
        return pb.ValidateSchemaResponse()

    @rpc
    async def ValidateMessage(self, request: Any, context: Context) -> Any:
        await self.catalog.caught_up()
        self.schemas.validate_message(request.parent, request)
        return pb.ValidateMessageResponse()


def handlers(servicer: SchemaServicer) -> grpc.GenericRpcHandler:
    unary = unary_method
    s = servicer
    return grpc.method_handlers_generic_handler(
        "google.pubsub.v1.SchemaService",
        {
            "CreateSchema": unary(s.CreateSchema, pb.CreateSchemaRequest, pb.Schema),
            "GetSchema": unary(s.GetSchema, pb.GetSchemaRequest, pb.Schema),
            "ListSchemas": unary(s.ListSchemas, pb.ListSchemasRequest, pb.ListSchemasResponse),
            "ListSchemaRevisions": unary(
                s.ListSchemaRevisions, pb.ListSchemaRevisionsRequest, pb.ListSchemaRevisionsResponse
            ),
            "CommitSchema": unary(s.CommitSchema, pb.CommitSchemaRequest, pb.Schema),
            "RollbackSchema": unary(s.RollbackSchema, pb.RollbackSchemaRequest, pb.Schema),
            "DeleteSchemaRevision": unary(
                s.DeleteSchemaRevision, pb.DeleteSchemaRevisionRequest, pb.Schema
            ),
            "DeleteSchema": unary(s.DeleteSchema, pb.DeleteSchemaRequest, pb.Empty),
            "ValidateSchema": unary(
                s.ValidateSchema, pb.ValidateSchemaRequest, pb.ValidateSchemaResponse
            ),
            "ValidateMessage": unary(
                s.ValidateMessage, pb.ValidateMessageRequest, pb.ValidateMessageResponse
            ),
        },
    )
